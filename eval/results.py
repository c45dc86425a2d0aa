"""The results file: tidy rows (eval.schema columns) appended to a .csv or .parquet file.

A row's identity is its KEY_COLUMNS plus a hash of what produced it (system config, target,
engine flags without their `env` record, protocol); a resumed run skips every identity already
in the file. Rows are written one measurement at a time, so an interrupted run loses at most the
measurement in flight. Use a new file when changing engine flags or the protocol: the old and
new rows would otherwise share KEY_COLUMNS, and tables would average them.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import subprocess
import uuid
from pathlib import Path

import pandas as pd

from eval.schema import ALL_COLUMNS, KEY_COLUMNS, LATER_COLUMNS

FLOAT_KEYS = ("temperature", "dels_alpha", "dels_beta")
INT_KEYS = ("concurrency", "input_len", "seed")
SUFFIXES = (".csv", ".parquet")
# Settings of a baseline row that must match for a speedup (besides the system).
SPEEDUP_MATCH = ("benchmark", "category", "temperature", "concurrency", "input_len", "seed")


def json_object(text, column: str) -> dict:
    """A JSON-object column's value ("" or NaN: {}); ValueError naming the column otherwise."""
    if text is None or (isinstance(text, float) and math.isnan(text)) or text == "":
        return {}
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        value = None
    if not isinstance(value, dict):
        raise ValueError(f"column {column!r} holds {str(text)[:60]!r}, which is not a JSON object")
    return value


def config_hash(system_config: str, target: str, engine_flags: str, protocol: str) -> str:
    flags = json_object(engine_flags, "engine_flags")
    flags.pop("env", None)
    payload = json.dumps([json_object(system_config, "system_config"), target, flags,
                          json_object(protocol, "protocol")], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _float_key(value) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return "nan"
    return "nan" if math.isnan(number) else repr(number)


def normalized(column: str, value):
    """A key column's value in one canonical form, so CSV round trips compare equal."""
    if column in FLOAT_KEYS:
        return _float_key(value)
    if column in INT_KEYS:
        try:
            return int(float(value))
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"column {column!r} holds {value!r}; expected a whole number") from None
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def identity(row: dict) -> tuple:
    """KEY_COLUMNS + the hash of the config that produced the row + the data's provenance (other
    prompts, e.g. a full set instead of a wheel's subset, are another measurement)."""
    key = tuple(normalized(c, row.get(c)) for c in KEY_COLUMNS)
    return key + (config_hash(row.get("system_config", ""), str(row.get("target", "")),
                              row.get("engine_flags", ""), row.get("protocol", "")),
                  normalized("data_provenance", row.get("data_provenance")))


class ResultsFile:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        if self.path.suffix not in SUFFIXES:
            raise ValueError(f"results file {self.path} must end in .csv or .parquet")
        self._old_header = False  # a CSV written before LATER_COLUMNS: rewritten on first append
        self.rows: list[dict] = self._read()
        self.done: set[tuple] = set()
        for number, row in enumerate(self.rows, start=1):
            try:
                self.done.add(identity(row))
            except ValueError as exc:
                raise ValueError(f"results file {self.path} row {number}: {exc}; the file was edited "
                                 "or damaged: fix that row or write to a new file") from None

    def _read(self) -> list[dict]:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return []
        if self.path.suffix == ".csv":
            frame = _read_csv(self.path)
        else:
            frame = _read_parquet(self.path)
        for column in LATER_COLUMNS:
            if column not in frame.columns:
                frame[column] = ""
        self._old_header = self.path.suffix == ".csv" and list(frame.columns) != ALL_COLUMNS
        missing = [c for c in ALL_COLUMNS if c not in frame.columns]
        if missing:
            raise ValueError(f"results file {self.path} lacks column(s) {missing}; it was written by "
                             "another schema version: write to a new file")
        return frame.to_dict(orient="records")

    def has(self, row: dict) -> bool:
        return identity(row) in self.done

    def append(self, row: dict) -> None:
        row = {c: row.get(c) for c in ALL_COLUMNS}
        row["accept_per_pos"] = (row["accept_per_pos"] if isinstance(row["accept_per_pos"], str)
                                 else json.dumps(list(row["accept_per_pos"] or [])))
        frame = pd.DataFrame([row], columns=ALL_COLUMNS)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.suffix == ".csv":
            if self._old_header:
                self._rewrite_csv()
            new = not self.path.exists() or self.path.stat().st_size == 0
            frame.to_csv(self.path, mode="a", header=new, index=False)
        else:
            old = pd.read_parquet(self.path) if self.path.exists() else None
            both = frame if old is None else pd.concat([old, frame], ignore_index=True)
            both = both.reindex(columns=ALL_COLUMNS)  # a file from before LATER_COLUMNS too
            tmp = self.path.with_suffix(".parquet.tmp")
            _typed(both).to_parquet(tmp, index=False)
            os.replace(tmp, self.path)
        self.rows.append(row)
        self.done.add(identity(row))

    def _rewrite_csv(self) -> None:
        """The rows read so far under today's header (columns added since: empty), replacing the
        file in one step: appending a longer row under an older header would shift its fields."""
        tmp = self.path.with_suffix(".csv.tmp")
        pd.DataFrame(self.rows, columns=ALL_COLUMNS).to_csv(tmp, index=False)
        os.replace(tmp, self.path)
        self._old_header = False

    def baseline_tokens_per_s(self, row: dict, baseline: str) -> float | None:
        """tokens_per_s of the baseline system's run row on the same setting, target, engine flags,
        protocol and data (the latest such row), or None."""
        found = None
        for r in self.rows:
            if (r["kind"] == "run" and r["system"] == baseline
                    and all(normalized(c, r[c]) == normalized(c, row[c]) for c in SPEEDUP_MATCH)
                    and str(r["target"]) == str(row["target"])
                    and _same_flags(r["engine_flags"], row["engine_flags"])
                    and r["protocol"] == row["protocol"]
                    and normalized("data_provenance", r.get("data_provenance"))
                    == normalized("data_provenance", row.get("data_provenance"))):
                found = float(r["tokens_per_s"])
        return found

    def job_rates(self, row: dict, baseline: str) -> list[float]:
        """tokens/s of the job's AR runs at the row's target, engine flags, protocol, concurrency
        and input length: the baseline's run rows and the paired references not marked outliers
        (the pool eval.paired judges a new reference against)."""
        out = []
        for r in self.rows:
            if (r["kind"] != "run" or str(r["target"]) != str(row["target"])
                    or not _same_flags(r["engine_flags"], row["engine_flags"]) or r["protocol"] != row["protocol"]
                    or any(normalized(c, r[c]) != normalized(c, row[c]) for c in ("concurrency", "input_len"))):
                continue
            if r["system"] == baseline:
                out.append(_number(r["tokens_per_s"]))
            elif _number(r.get("paired_ar_outlier")) != 1:
                out.append(_number(r.get("paired_ar_output_tokens")) / (_number(r.get("paired_ar_wall_s")) or math.nan))
        return [x for x in out if math.isfinite(x)]


def _number(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        raise ValueError(f"results file {path} is not a readable CSV ({exc}); it was damaged: "
                         "restore it or write to a new file") from None


def _read_parquet(path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise ValueError(f"results file {path} is not a readable parquet file ({exc}); restore it "
                         "or write to a new file") from None


def _same_flags(a: str, b: str) -> bool:
    a, b = json_object(a, "engine_flags"), json_object(b, "engine_flags")
    a.pop("env", None)
    b.pop("env", None)
    return a == b


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    """Numeric columns as numbers (parquet keeps types; rows read back from CSV are strings)."""
    frame = frame.copy()
    for column in ("temperature", "dels_alpha", "dels_beta", "tau", "wall_s", "tokens_per_s",
                   "speedup", "paired_ar_wall_s", "stage_ms"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype("float64")
    for column in ("concurrency", "input_len", "seed", "num_prompts", "num_truncated", "num_drafts",
                   "num_draft_tokens", "num_accepted_tokens", "output_tokens", "paired_ar_output_tokens",
                   "paired_ar_retries", "paired_ar_outlier"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype("Int64")
    for column in ALL_COLUMNS:
        if frame[column].dtype == object:
            frame[column] = frame[column].map(lambda v: "" if v is None else str(v))
    return frame


def git_revision() -> str:
    """HEAD of the repository this package lives in, "+dirty" with uncommitted changes."""
    root = Path(__file__).resolve().parents[1]
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return rev + ("+dirty" if rev and dirty else "")


def new_run_id() -> str:
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
