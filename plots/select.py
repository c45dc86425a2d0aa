"""Pick the rows each view needs and average them the same way everywhere.

Conventions shared by every figure and table:
- A cell is the mean over seeds of the per-seed mean over the remaining rows
  (categories, for benchmarks split into categories). Std is across seeds.
- Systems are ordered as they first appear in the file, the AR baseline first.
- A *sweep* is one system measured at several (dels_alpha, dels_beta) settings on
  the same benchmark and setting. Sweep rows feed the DeLS heatmap only; the
  other views leave them out (and say so) because no single setting is "the" one.
- The *main setting* of a benchmark is its lowest concurrency and lowest input
  length, the Table-1 regime (concurrency one, natural length).
"""

import os
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from plots.intervals import mean_interval
from plots.table_intervals import prompt_interval

BASELINE_SYSTEM = "AR"
# Stage names that measure the whole step rather than one part of it (drawn as a
# marker, not stacked, so the bar does not count the step twice).
TOTAL_STAGE_PATTERN = re.compile(r"wall|total", re.IGNORECASE)
SETTING_COLUMNS = ["target", "system", "benchmark", "temperature", "concurrency", "input_len"]


@dataclass
class Selection:
    """Rows for one view plus the notes about what was left out and why."""

    rows: pd.DataFrame
    notes: list[str] = field(default_factory=list)


def is_baseline(system: str) -> bool:
    return system.upper() == BASELINE_SYSTEM


def without_baseline(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of every system but AR."""
    keep = np.array([not is_baseline(s) for s in rows["system"]], dtype=bool)
    return rows[keep]


def ordered_unique(values) -> list:
    """Unique values in first-appearance order."""
    return list(dict.fromkeys(values))


def system_order(df: pd.DataFrame) -> list[str]:
    systems = ordered_unique(df["system"])
    return [s for s in systems if is_baseline(s)] + [s for s in systems if not is_baseline(s)]


def target_label(target: str) -> str:
    """Model path -> short name for titles ("/models/Qwen3-8B/" -> "Qwen3-8B")."""
    name = os.path.basename(target.rstrip("/"))
    return name or target or "(no target)"


def format_temperature(temperature: float) -> str:
    return f"T={temperature:g}"


def run_rows(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["kind"] == "run"]


def stage_rows(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["kind"] == "stage"]


def split_sweeps(runs: pd.DataFrame) -> tuple[Selection, pd.DataFrame]:
    """Separate (alpha, beta) sweep rows from fixed-setting rows.

    Returns (fixed rows with notes on what was moved out, sweep rows).
    """
    pairs = runs["dels_alpha"].fillna(-np.inf).astype(str) + "," + runs["dels_beta"].fillna(-np.inf).astype(str)
    n_pairs = pairs.groupby([runs[c] for c in SETTING_COLUMNS], sort=False).transform("nunique")
    in_sweep = (n_pairs > 1).astype(bool)
    sweep = runs[in_sweep]
    notes = []
    for (target, system, benchmark), group in sweep.groupby(["target", "system", "benchmark"], sort=False):
        n = group[["dels_alpha", "dels_beta"]].drop_duplicates().shape[0]
        notes.append(
            f"{system} on {benchmark} ({target_label(target)}) has {n} (dels_alpha, dels_beta) settings, "
            f"a sweep: shown in the DeLS heatmap, left out of the other views"
        )
    return Selection(runs[~in_sweep], notes), sweep


def main_setting(runs: pd.DataFrame, keep_sweeps: bool = False) -> Selection:
    """Run rows at each benchmark's lowest concurrency and input length.

    Sweep rows are dropped (with notes) unless keep_sweeps, for callers such as
    plots.tables that drop and note them themselves.
    """
    if keep_sweeps:
        fixed = Selection(runs)
    else:
        fixed, _ = split_sweeps(runs)
    rows = fixed.rows
    if rows.empty:
        return Selection(rows, fixed.notes)
    group = [rows["target"], rows["benchmark"]]
    lowest_c = rows["concurrency"].groupby(group, sort=False).transform("min")
    rows = rows[rows["concurrency"] == lowest_c]
    group = [rows["target"], rows["benchmark"]]
    lowest_len = rows["input_len"].groupby(group, sort=False).transform("min")
    return Selection(rows[rows["input_len"] == lowest_len], fixed.notes)


def seed_mean(rows: pd.DataFrame, by: list[str], value: str) -> pd.DataFrame:
    """Mean over seeds of per-seed means; columns by + [value, value_std, n_seeds].

    Rows whose value is NaN are ignored. Groups keep first-appearance order.
    """
    rows = rows[rows[value].notna()]
    per_seed = rows.groupby(by + ["seed"], sort=False)[value].mean().reset_index()
    out = per_seed.groupby(by, sort=False)[value].agg(["mean", "std", "count"]).reset_index()
    return out.rename(columns={"mean": value, "std": f"{value}_std", "count": "n_seeds"})


def interval_errors(rows: pd.DataFrame, by: list[str], value: str, cells: pd.DataFrame) -> np.ndarray:
    """Error bars [2, len(cells)] for seed_mean's cells: the distance from each cell's value down
    and up to its 95% bootstrap interval over its prompts where they were measured one by one
    (plots.table_intervals.prompt_interval), else over its rows (plots.intervals); 0 (no bar)
    where a cell has one row and no per-prompt rows."""
    rows = rows[rows[value].notna()]
    groups = {k if isinstance(k, tuple) else (k,): g for k, g in rows.groupby(by, sort=False)}
    out = np.zeros((2, len(cells)))
    for i, (_, c) in enumerate(cells.iterrows()):
        group = groups.get(tuple(c[by]), rows.iloc[:0])
        iv = prompt_interval([group], value, c[value]) or mean_interval(group[value], point=c[value])
        if not np.isnan(iv.low):
            out[:, i] = [max(iv.point - iv.low, 0.0), max(iv.high - iv.point, 0.0)]
    return out


def mean_accept_per_pos(rows: pd.DataFrame) -> np.ndarray:
    """Elementwise mean of the accept_per_pos lists: per seed first, then over seeds.

    Lists of different length are padded with NaN. Returns float64 [k]; empty if no row has one.
    """
    per_seed = []
    for _, group in rows.groupby("seed", sort=False):
        lists = [v for v in group["accept_per_pos"] if len(v) > 0]
        if lists:
            per_seed.append(_nanmean_padded(lists))
    return _nanmean_padded(per_seed) if per_seed else np.zeros(0)


def _nanmean_padded(lists) -> np.ndarray:
    k = max(len(v) for v in lists)
    padded = np.full((len(lists), k), np.nan)
    for i, v in enumerate(lists):
        padded[i, : len(v)] = v
    with np.errstate(all="ignore"):
        counts = np.sum(~np.isnan(padded), axis=0)
        return np.nansum(padded, axis=0) / counts


def split_by(rows: pd.DataFrame, columns: list[str]) -> list[tuple[dict, pd.DataFrame]]:
    """Group rows by the columns among `columns` that take more than one value.

    Returns [(values of the varying columns, rows)] in first-appearance order; a
    single ({}, rows) when nothing varies.
    """
    varying = [c for c in columns if rows[c].nunique() > 1]
    if not varying:
        return [({}, rows)]
    return [
        (dict(zip(varying, key if isinstance(key, tuple) else (key,))), group)
        for key, group in rows.groupby(varying, sort=False)
    ]


def describe(values: dict) -> tuple[str, str]:
    """{"target": ..., "temperature": 0.0} -> (file-name suffix, title suffix)."""
    slugs, words = [], []
    for column, value in values.items():
        if column == "target":
            text = target_label(value)
        elif column == "temperature":
            text = format_temperature(value)
        elif column == "concurrency":
            text = f"c={value}"
        elif column == "input_len":
            text = f"input {value}" if value else "natural input"
        else:
            text = str(value)
        words.append(text)
        slugs.append(re.sub(r"[^A-Za-z0-9.=-]+", "-", text).strip("-"))
    suffix = "".join(f"__{s}" for s in slugs)
    return suffix, ", ".join(words)
