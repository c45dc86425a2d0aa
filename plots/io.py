"""Load eval's results table (parquet or CSV) and check it can be plotted.

The schema lives in eval/schema.py; plots only reads the columns listed in
REQUIRED_COLUMNS, so provenance columns may be absent without harm. Plots reads result files
and imports nothing from eval (tests/test_layering.py keeps the two column lists in step).
"""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from plots.prompt_rows import attach_prompt_rows

# Every column some figure or table reads: eval's key columns, then the metrics.
REQUIRED_COLUMNS = [
    "kind",
    "system",
    "benchmark",
    "category",
    "temperature",
    "concurrency",
    "input_len",
    "seed",
    "dels_alpha",
    "dels_beta",
    "stage",
    "tau",
    "accept_per_pos",
    "tokens_per_s",
    "speedup",
    "stage_ms",
    "target",
]
TEXT_COLUMNS = ["kind", "system", "benchmark", "category", "stage", "target"]
FLOAT_COLUMNS = ["temperature", "dels_alpha", "dels_beta", "tau", "tokens_per_s", "speedup", "stage_ms"]
INT_COLUMNS = ["concurrency", "input_len", "seed"]
KINDS = ("run", "stage")


def load_results(path: str | Path) -> pd.DataFrame:
    """Read a results file (.parquet or .csv) and return it validated.

    Raises ValueError naming the problem: missing file, unknown suffix, empty file,
    no rows, missing columns, or a column whose values have the wrong type.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"results file {path} does not exist; pass the file `python -m eval run` wrote")
    if path.stat().st_size == 0:
        raise ValueError(f"results file {path} is empty (0 bytes); rerun eval or pass another file")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        df = pd.read_parquet(path)
    elif suffix == ".csv":
        # keep_default_na=False so "" stays "" in text columns; numbers are coerced below.
        df = pd.read_csv(path, keep_default_na=False, na_values={c: ["", "nan", "NaN"] for c in FLOAT_COLUMNS})
    else:
        raise ValueError(f"results file {path} has suffix {suffix!r}; expected .parquet or .csv")
    # Prompts measured one at a time (eval.by_prompt) carry their per-prompt rows: the
    # intervals resample those.
    return attach_prompt_rows(validate_results(df, source=str(path)), path)


def validate_results(df: pd.DataFrame, source: str = "results") -> pd.DataFrame:
    """Check columns, rows and types; return a copy with normalized dtypes.

    Text columns become str with "" for missing, float columns float64 (NaN for
    missing), int columns int64, accept_per_pos a list[float] per row.
    """
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(
            f"{source} lacks column(s) {', '.join(missing)}; plots needs the eval.schema columns "
            f"{', '.join(REQUIRED_COLUMNS)} (write the file with `python -m eval run`)"
        )
    if len(df) == 0:
        raise ValueError(f"{source} has no rows; run `python -m eval run` to fill it before plotting")

    df = df.copy()
    for column in TEXT_COLUMNS:
        df[column] = df[column].map(_text).astype(object)
    for column in FLOAT_COLUMNS:
        df[column] = _numeric(df[column], column, source).astype("float64")
    for column in INT_COLUMNS:
        values = _numeric(df[column], column, source)
        bad = values.isna() | ~np.isfinite(values) | (values != values.round())
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{source} column {column!r} needs whole numbers; row {row} holds {df[column].iloc[row]!r}")
        df[column] = values.astype("int64")
    unknown = sorted(set(df["kind"]) - set(KINDS))
    if unknown:
        raise ValueError(f"{source} column 'kind' holds {unknown}; each row must be one of {list(KINDS)}")
    df["accept_per_pos"] = [parse_accept_per_pos(v, source) for v in df["accept_per_pos"]]
    return df.reset_index(drop=True)


def parse_accept_per_pos(value, source: str = "results") -> list[float]:
    """One accept_per_pos cell (JSON text, list or array; empty for AR) -> list[float]."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return []
    if isinstance(value, str):
        if value.strip() == "":
            return []
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{source} column 'accept_per_pos' holds {value[:40]!r}, which is not a JSON list "
                f"of acceptance rates ({err})"
            ) from None
    if not isinstance(value, (list, tuple, np.ndarray)):
        raise ValueError(f"{source} column 'accept_per_pos' holds {value!r}; expected a JSON list of rates")
    try:
        return [float(v) for v in value]
    except (TypeError, ValueError):
        raise ValueError(f"{source} column 'accept_per_pos' holds non-numeric entries: {list(value)[:8]!r}") from None


def _text(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def _numeric(series: pd.Series, column: str, source: str) -> pd.Series:
    blank = series.map(_is_blank).astype(bool)
    values = pd.to_numeric(series.where(~blank, np.nan), errors="coerce")
    bad = values.isna() & ~blank
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{source} column {column!r} needs numbers; row {row} holds {series.iloc[row]!r}")
    return values


def _is_blank(value) -> bool:
    if value is None:
        return True
    if isinstance(value, float):
        return math.isnan(value)
    return isinstance(value, str) and value.strip().lower() in ("", "nan")
