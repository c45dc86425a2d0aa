"""The 95% interval of each kind of table value, from the result rows behind it (plots.intervals).

Where every row behind a value was measured prompt by prompt (a per-prompt file beside the
results, plots.prompt_rows), the interval resamples prompts within each row instead
(`prompt_interval`): a cell, an Average over benchmarks and a pooled row alike are recomputed
from resampled prompts, each row (one benchmark, setting and seed) keeping its number of
prompts. Why stratified: the headline is defined as the mean over these benchmarks, which are not
a sample from some larger set of benchmarks; what is uncertain is which prompts of each benchmark
were measured and how each paired measurement's timing fell. Resampling whole rows instead (7 in
the main job) mixes the real differences between benchmarks (1.07x-1.44x) into the interval.
Without per-prompt rows (older files, c > 1):
- a cell (a mean of per-row values, e.g. each prompt's paired speedup): the mean, rows resampled;
- an average over benchmarks: the mean of the averaged cells, cells resampled;
- a pooled value: tau = 1 + sum accepted / sum drafts (per-prompt tau weighted by drafts),
  speedup = pooled tokens/s over the rows' own AR references' pooled tokens/s, rows resampled
  with their references (the paired AR run, else AR's row on the same setting and seed).
Rows whose paired reference was an outlier (plots.paired) have no speedup and are left out.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from plots.intervals import (RESAMPLES, Interval, mean_interval, pooled_speedup_interval, ratio_interval,
                             stratified_bootstrap)
from plots.prompt_rows import prompt_sample

# The values that carry an interval in tables.
INTERVAL_VALUES = ("tau", "speedup")
MATCH = ["target", "benchmark", "category", "temperature", "concurrency", "input_len", "seed"]
NOTE = (f"[low, high]: 95% percentile bootstrap interval over result rows (prompts; {RESAMPLES} "
        "resamples, fixed seed); an Average's over its benchmarks; 'n=1, no interval' where one "
        "row stands alone.")
PROMPT_NOTE = (f"[low, high]: 95% percentile bootstrap interval over prompts, resampled within each "
               f"benchmark (its paired AR run beside each prompt; {RESAMPLES} resamples, fixed seed, "
               "widened by sqrt(n / (n - 1)) for n prompts a benchmark); the benchmarks and their "
               "equal weights in the Average stay fixed.")
# value -> (the per-prompt sums it is a function of, that function)
PROMPT_STATISTICS = {
    "speedup": (("tokens", "wall", "ref_tokens", "ref_wall"), lambda t, w, rt, rw: (t / w) / (rt / rw)),
    "tau": (("accepted", "drafts"), lambda accepted, drafts: 1.0 + accepted / drafts),
}


def numbers(rows: pd.DataFrame, column: str) -> np.ndarray:
    if column not in rows.columns:
        return np.full(len(rows), math.nan)
    return pd.to_numeric(rows[column], errors="coerce").to_numpy(dtype=float, copy=True)


def reference_arrays(rows: pd.DataFrame, baseline: pd.DataFrame | None) -> tuple[np.ndarray, np.ndarray]:
    """Each row's AR reference (output tokens, wall s): its paired AR run where --paired measured
    one, else the baseline's row on the same setting and seed (NaN where neither exists)."""
    ref_tokens, ref_wall = numbers(rows, "paired_ar_output_tokens"), numbers(rows, "paired_ar_wall_s")
    if baseline is not None and len(baseline):
        keys = [c for c in MATCH if c in rows.columns and c in baseline.columns]
        lookup = {tuple(r[keys]): (r["output_tokens"], r["wall_s"]) for _, r in baseline.iterrows()}
        for i, (_, row) in enumerate(rows.iterrows()):
            if math.isnan(ref_wall[i]) and tuple(row[keys]) in lookup:
                ref_tokens[i], ref_wall[i] = (float(x) for x in lookup[tuple(row[keys])])
    return ref_tokens, ref_wall


def pooled_interval(rows: pd.DataFrame, value: str, baseline: pd.DataFrame | None = None,
                    point: float | None = None) -> Interval:
    """Interval of the pooled tau or speedup of one system's rows (module docstring)."""
    if value == "tau" and np.nansum(numbers(rows, "num_drafts")) > 0:
        return ratio_interval(numbers(rows, "num_accepted_tokens"), numbers(rows, "num_drafts"),
                              offset=1.0, point=point)
    if value == "speedup" and {"output_tokens", "wall_s"} <= set(rows.columns):
        usable = rows[rows["speedup"].notna()]
        ref_tokens, ref_wall = reference_arrays(usable, baseline)
        return pooled_speedup_interval(numbers(usable, "output_tokens"), numbers(usable, "wall_s"),
                                       ref_tokens, ref_wall, point=point)
    return mean_interval(numbers(rows, value), point=point)  # AR's tau, or no counters


def cell_interval(rows: pd.DataFrame, value: str, point: float) -> Interval:
    """A Table-1 cell: the mean of its rows' values (rows resampled), shown at `point`."""
    return mean_interval(numbers(rows, value), point=point)


def resamples_prompts(rows: pd.DataFrame) -> bool:
    """Whether every row has per-prompt rows, at least two: a row of one prompt has nothing to
    resample, and the interval over rows says more."""
    sample = prompt_sample(rows)
    return sample is not None and min(len(r["tokens"]) for r in sample) >= 2


def prompt_interval(cells: list[pd.DataFrame], value: str, point: float, pooled: bool = False) -> Interval | None:
    """The interval over prompts (module docstring) of the mean over `cells` of each cell's mean
    over its rows of the row's value, or with `pooled` of the value over every prompt at once;
    None unless every row (with a value) has per-prompt rows, at least two."""
    if value not in PROMPT_STATISTICS:
        return None
    cells = [c[c[value].notna()] for c in cells]
    if not all(resamples_prompts(c) for c in cells):
        return None
    samples = [prompt_sample(c) for c in cells]
    names, formula = PROMPT_STATISTICS[value]
    rows = [r for sample in samples for r in sample]
    bounds = np.cumsum([0] + [len(s) for s in samples])

    def statistic(idx: list[np.ndarray]) -> np.ndarray:
        sums = [[r[name][i].sum(axis=1) for name in names] for r, i in zip(rows, idx)]
        with np.errstate(all="ignore"):  # a resample without drafts has no tau: dropped
            if pooled:
                return formula(*(sum(s[k] for s in sums) for k in range(len(names))))
            per_row = [formula(*s) for s in sums]
            return np.mean([np.mean(per_row[a:b], axis=0) for a, b in zip(bounds[:-1], bounds[1:])], axis=0)

    return stratified_bootstrap([len(r["tokens"]) for r in rows], statistic, point)
