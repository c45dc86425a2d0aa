"""Paired AR references that cannot be trusted, and speedups that contradict tokens/s.

`eval run --paired` divides each system row's tokens/s by an AR run measured just before it.
That reference is itself one run: when the machine stalls during it (observed: references at
10-29 tokens/s in a job whose AR ran at 86), the ratio is inflated (DSpark "1.81x" at 64 tok/s).

The rule (`is_outlier`): a reference is an outlier when its tokens/s lies outside
[median / 2, median * 2] of the job's other AR runs (AR's own rows and the other paired
references at the same target, engine flags, protocol, concurrency and input length). Why a
ratio and not a z-score: at one setting AR's tokens/s moves with prompt length by well under
2x, while stalls cost 3-8x; a MAD z-score over the 7-14 AR runs of a job has a MAD near 0 when
the runs agree, and would flag ordinary 5% jitter. The runner re-measures such a reference (up
to 2 retries) and marks the row (`paired_ar_outlier`) if it stays one; tables drop the row's
speedup, and apply the same rule to files written before the runner checked.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

OUTLIER_FACTOR = 2.0
# A system's speedup and its tokens/s over AR's median tokens/s disagree when they sit on
# opposite sides of 1 and differ by more than this factor (near-1 jitter stays quiet).
CONSISTENCY_FACTOR = 1.1
BASELINE = "AR"
JOB_COLUMNS = ["target", "engine_flags", "protocol", "concurrency", "input_len"]


def is_outlier(rate: float, reference_rates, factor: float = OUTLIER_FACTOR) -> bool:
    """rate outside [median / factor, median * factor] of the reference rates (False without any)."""
    refs = np.asarray([r for r in reference_rates if r is not None and np.isfinite(r) and r > 0], dtype=float)
    if refs.size == 0 or not (rate is not None and math.isfinite(rate)):
        return False
    median = float(np.median(refs))
    return rate < median / factor or rate > median * factor


def reference_rates(runs: pd.DataFrame) -> pd.Series:
    """Each row's paired AR tokens/s (NaN where it has none)."""
    if not {"paired_ar_wall_s", "paired_ar_output_tokens"} <= set(runs.columns):
        return pd.Series(math.nan, index=runs.index)
    tokens = pd.to_numeric(runs["paired_ar_output_tokens"], errors="coerce")
    wall = pd.to_numeric(runs["paired_ar_wall_s"], errors="coerce")
    return (tokens / wall.where(wall > 0)).astype(float)


def outlier_references(runs: pd.DataFrame) -> pd.Series:
    """True for run rows whose paired AR reference is an outlier: marked by the runner, or by
    the rule against the job's AR rows and paired references (files written before the mark)."""
    out = pd.Series(False, index=runs.index)
    if "paired_ar_outlier" in runs.columns:
        out |= pd.to_numeric(runs["paired_ar_outlier"], errors="coerce").fillna(0).astype(float) > 0
    rates = reference_rates(runs)
    keys = [c for c in JOB_COLUMNS if c in runs.columns]
    job = runs[keys].apply(lambda r: _job_key(r, keys), axis=1) if keys else pd.Series(0, index=runs.index)
    ar = pd.Series([s.upper() == BASELINE for s in runs["system"]], index=runs.index)
    for key in job.unique():
        members = job == key
        pool = list(runs.loc[members & ar, "tokens_per_s"].astype(float)) + list(rates[members].dropna())
        for i in rates[members].dropna().index:
            out[i] = out[i] or is_outlier(rates[i], pool)
    return out


def without_outlier_speedups(df: pd.DataFrame) -> pd.DataFrame:
    """A copy whose run rows with an outlier paired reference have speedup NaN (not used) and
    `speedup_excluded` True; idempotent."""
    out = df.copy()
    runs = out["kind"] == "run" if "kind" in out.columns else pd.Series(True, index=out.index)
    excluded = pd.Series(False, index=out.index)
    excluded[runs] = outlier_references(out[runs])
    out.loc[excluded, "speedup"] = math.nan
    out["speedup_excluded"] = excluded | (out["speedup_excluded"] if "speedup_excluded" in out.columns
                                          else False)
    return out


def remeasured_count(df: pd.DataFrame) -> int:
    """Run rows whose paired reference was measured again (column paired_ar_retries > 0)."""
    if "paired_ar_retries" not in df.columns:
        return 0
    return int((pd.to_numeric(df["paired_ar_retries"], errors="coerce").fillna(0) > 0).sum())


def inconsistent_speedups(runs: pd.DataFrame) -> list[str]:
    """One line per system and setting whose mean speedup and mean tokens/s against AR's median
    tokens/s sit on opposite sides of 1 (by more than CONSISTENCY_FACTOR): one of its references
    (or AR's own rows) ran at another speed than the rest."""
    lines = []
    settings = [c for c in ("target", "temperature", "concurrency", "input_len") if c in runs.columns]
    for key, group in runs.groupby(settings, sort=False):
        ar = group[[s.upper() == BASELINE for s in group["system"]]]
        median = float(np.median(ar["tokens_per_s"].astype(float))) if len(ar) else math.nan
        if not median > 0:
            continue
        for system, mine in group[[s.upper() != BASELINE for s in group["system"]]].groupby("system", sort=False):
            speedup = float(mine["speedup"].astype(float).mean())
            implied = float(mine["tokens_per_s"].astype(float).mean()) / median
            if _opposite(speedup, implied):
                lines.append(f"{system}: speedup {speedup:.2f}x but {implied * median:.0f} tok/s against "
                             f"AR's median {median:.0f} tok/s ({implied:.2f}x) at "
                             + ", ".join(f"{c}={v}" for c, v in zip(settings, _tuple(key)) if c != "target")
                             + ": its paired AR references ran at another speed than AR's own rows")
    return lines


def reference_notes(df: pd.DataFrame) -> list[str]:
    """What a reader of a speedup table must know about its references: how many were measured
    again, how many rows lost their speedup (outliers), and every speedup that contradicts
    tokens/s (checked on the rows before any was dropped)."""
    runs = df[df["kind"] == "run"] if "kind" in df.columns else df
    if runs.empty:
        return []
    notes = []
    remeasured, excluded = remeasured_count(runs), int(outlier_references(runs).sum())
    if remeasured or excluded:
        notes.append(f"{remeasured} paired AR reference(s) measured again (an outlier against the job's "
                     f"AR runs at first); {excluded} row(s) whose reference stayed an outlier (tokens/s "
                     f"outside [median / {OUTLIER_FACTOR:g}, median x {OUTLIER_FACTOR:g}] of the job's AR "
                     "runs): their speedup is not used.")
    notes += [f"inconsistent: {line}" for line in inconsistent_speedups(runs)]
    return notes


def _opposite(speedup: float, implied: float) -> bool:
    """On opposite sides of 1, and apart by more than CONSISTENCY_FACTOR (near-1 jitter is not)."""
    if not (speedup > 0 and implied > 0):
        return False
    sides = (speedup > 1 > implied) or (speedup < 1 < implied)
    return sides and max(speedup / implied, implied / speedup) > CONSISTENCY_FACTOR


def _tuple(key) -> tuple:
    return key if isinstance(key, tuple) else (key,)


def _job_key(row: pd.Series, keys: list[str]) -> tuple:
    """The job a row belongs to; engine flags without `env` (recorded, not speed-defining alone)."""
    out = []
    for column in keys:
        value = row[column]
        if column == "engine_flags" and isinstance(value, str) and value.strip().startswith("{"):
            flags = json.loads(value)
            flags.pop("env", None)
            value = json.dumps(flags, sort_keys=True)
        out.append(str(value))
    return tuple(out)
