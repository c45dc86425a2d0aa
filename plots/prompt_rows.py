"""The per-prompt rows beside a results file (written by eval.by_prompt), attached to their
result rows so that intervals can resample prompts (plots.table_intervals).

`results.csv` -> `results.prompts.csv`. Each result row gets a `prompts` value: a dict of numpy
arrays (one entry per prompt) when the file holds all its prompts, else None (files from before
the per-prompt file, rows at c > 1, a measurement interrupted and measured again). Plots imports
nothing from eval; tests/test_layering.py keeps SUFFIX and the columns in step with it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

SUFFIX = ".prompts.csv"  # eval.prompt_results.SUFFIX
KEY = ["run_id", "kind", "system", "benchmark", "category", "temperature", "concurrency", "input_len",
       "seed", "dels_alpha", "dels_beta", "stage"]
FLOAT_KEYS = ("temperature", "dels_alpha", "dels_beta")
INT_KEYS = ("concurrency", "input_len", "seed")
# array name -> per-prompt column
ARRAYS = {"tokens": "output_tokens", "wall": "wall_s", "ref_tokens": "paired_ar_output_tokens",
          "ref_wall": "paired_ar_wall_s", "accepted": "num_accepted_tokens", "drafts": "num_drafts"}
COLUMN = "prompts"


def prompt_rows_path(results_path: str | Path) -> Path:
    path = Path(results_path)
    return path.with_name(path.stem + SUFFIX)


def attach_prompt_rows(results: pd.DataFrame, results_path: str | Path) -> pd.DataFrame:
    """A copy of `results` with the `prompts` column (None everywhere without a per-prompt file)."""
    out = results.copy()
    out[COLUMN] = None
    path = prompt_rows_path(results_path)
    if "run_id" not in out.columns or not path.is_file() or path.stat().st_size == 0:
        return out
    prompts = pd.read_csv(path, keep_default_na=False, na_values={c: ["", "nan", "NaN"] for c in ARRAYS.values()})
    missing = [c for c in KEY + list(ARRAYS.values()) if c not in prompts.columns]
    if missing:
        raise ValueError(f"per-prompt file {path} lacks column(s) {missing}; it was not written by "
                         "`python -m eval run`: move it away or rerun the eval")
    groups = {key: group for key, group in prompts.groupby(prompts.apply(_key, axis=1), sort=False)}
    out[COLUMN] = [_arrays(groups.get(_key(row)), row.get("num_prompts")) for _, row in out.iterrows()]
    return out


def _arrays(group: pd.DataFrame | None, num_prompts) -> dict | None:
    """The prompts' arrays when the group holds every prompt of its row exactly once."""
    try:
        expected = int(float(num_prompts))
    except (TypeError, ValueError):
        return None
    if group is None or len(group) != expected or group["prompt"].nunique() != expected:
        return None
    return {name: pd.to_numeric(group[column], errors="coerce").to_numpy(dtype=float)
            for name, column in ARRAYS.items()}


def _key(row) -> tuple:
    """A row's identity in one canonical form (CSV round trips of numbers compare equal)."""
    return tuple(_normal(c, row[c]) for c in KEY)


def _normal(column: str, value):
    if column in FLOAT_KEYS:
        number = pd.to_numeric(value, errors="coerce")
        return "nan" if number is None or math.isnan(number) else repr(float(number))
    if column in INT_KEYS:
        return int(float(value))
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def prompt_sample(rows: pd.DataFrame) -> list[dict] | None:
    """Each row's prompt arrays, or None unless every row has them."""
    if COLUMN not in rows.columns or rows.empty:
        return None
    sample = list(rows[COLUMN])
    return sample if all(isinstance(s, dict) and len(s["tokens"]) for s in sample) else None


def concatenated(sample: list[dict], name: str) -> np.ndarray:
    return np.concatenate([s[name] for s in sample])
