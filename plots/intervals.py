"""95% intervals for speedups and acceptance lengths: a percentile bootstrap over prompts (rows),
or over the prompts within each result row (`stratified_bootstrap`, plots.table_intervals).

Every table cell, average and pooled value is a statistic of some result rows (one row = one
measurement, in the main job one prompt of one benchmark). Its interval recomputes the same
statistic on rows drawn with replacement, RESAMPLES times, and takes the 2.5th and 97.5th
percentiles. A fixed seed makes printed tables reproducible; one row gives no interval
("n=1, no interval"), never a made-up one.

Pure numpy: plots (which reads result files only) and eval's summary both import it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

RESAMPLES = 2000
SEED = 0
LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    point: float
    low: float  # NaN when there is no interval (n < 2, or no number)
    high: float
    n: int  # rows the statistic was computed over

    def text(self, digits: int = 2, unit: str = "") -> str:
        """'1.18× [1.09, 1.27]'; '1.18× (n=1, no interval)' for one row; '—' without a value."""
        if math.isnan(self.point):
            return "—"
        shown = f"{self.point:.{digits}f}{unit}"
        if math.isnan(self.low):
            return f"{shown} (n={self.n}, no interval)"
        return f"{shown} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def bootstrap(n: int, statistic: Callable[[np.ndarray], np.ndarray], point: float,
              resamples: int = RESAMPLES, seed: int = SEED, level: float = LEVEL) -> Interval:
    """Percentile interval of `statistic` over n rows. statistic(idx) takes an integer array of
    shape (resamples, n) of row indices and returns one value per resample (vectorized, so
    2000 resamples of a table cell cost microseconds)."""
    if n < 2 or math.isnan(point):
        return Interval(point, math.nan, math.nan, n)
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    values = np.asarray(statistic(idx), dtype=float)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return Interval(point, math.nan, math.nan, n)
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(values, [tail, 100.0 - tail])
    return Interval(point, float(low), float(high), n)


def stratified_bootstrap(sizes: list[int], statistic: Callable[[list[np.ndarray]], np.ndarray],
                         point: float, resamples: int = RESAMPLES, seed: int = SEED,
                         level: float = LEVEL) -> Interval:
    """Percentile interval of `statistic` when the rows fall into fixed strata (a result row's
    prompts): each resample draws every stratum's own number of rows from that stratum, so the
    strata and their weights stay as measured. statistic(idx) takes one integer array per
    stratum, of shape (resamples, size), of row indices within it.

    A stratum of n rows resampled gives (n - 1) / n of its mean's variance: the interval is
    widened about the point by sqrt(n / (n - 1)) for the smallest stratum (1.054 at n = 10),
    never narrowed. A stratum of one row gives no interval."""
    n = int(sum(sizes))
    if not sizes or min(sizes) < 2 or math.isnan(point):
        return Interval(point, math.nan, math.nan, n)
    rng = np.random.default_rng(seed)
    values = np.asarray(statistic([rng.integers(0, k, size=(resamples, k)) for k in sizes]), dtype=float)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return Interval(point, math.nan, math.nan, n)
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(values, [tail, 100.0 - tail])
    widen = math.sqrt(min(sizes) / (min(sizes) - 1))
    return Interval(point, float(point - widen * max(point - low, 0.0)),
                    float(point + widen * max(high - point, 0.0)), n)


def mean_interval(values, point: float | None = None, **kw) -> Interval:
    """The mean of per-row values (e.g. per-prompt paired speedups), resampled by row.
    point: the value the table shows (default: the plain mean)."""
    x = _finite(values)
    centre = float(x.mean()) if x.size else math.nan
    return bootstrap(x.size, lambda idx: x[idx].mean(axis=1), centre if point is None else point, **kw)


def ratio_interval(numerators, denominators, offset: float = 0.0, point: float | None = None,
                   **kw) -> Interval:
    """offset + sum(num) / sum(den) with rows resampled together: the pooled tau
    (1 + accepted / drafts, offset 1) is the draft-weighted mean of per-prompt tau."""
    num, den = _paired(numerators, denominators)
    pooled = offset + num.sum() / den.sum() if den.size and den.sum() > 0 else math.nan
    with np.errstate(all="ignore"):  # a resample of rows without drafts has no ratio: dropped
        return bootstrap(num.size, lambda idx: offset + num[idx].sum(1) / den[idx].sum(1),
                         pooled if point is None else point, **kw)


def pooled_speedup_interval(tokens, wall_s, ref_tokens, ref_wall_s, point: float | None = None,
                            **kw) -> Interval:
    """(sum tokens / sum wall) / (sum ref tokens / sum ref wall): a system's pooled tokens/s over
    its AR references' pooled tokens/s, each row keeping its own reference (paired runs)."""
    arrays = [np.asarray(a, dtype=float) for a in (tokens, wall_s, ref_tokens, ref_wall_s)]
    keep = np.logical_and.reduce([np.isfinite(a) for a in arrays]) & (arrays[1] > 0) & (arrays[3] > 0)
    t, w, rt, rw = (a[keep] for a in arrays)

    def stat(idx):
        return (t[idx].sum(1) / w[idx].sum(1)) / (rt[idx].sum(1) / rw[idx].sum(1))

    pooled = float(stat(np.arange(t.size)[None, :])[0]) if t.size else math.nan
    return bootstrap(t.size, stat, pooled if point is None else point, **kw)


def _finite(values) -> np.ndarray:
    x = np.asarray(values, dtype=float).ravel()
    return x[np.isfinite(x)]


def _paired(a, b) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(a, dtype=float).ravel(), np.asarray(b, dtype=float).ravel()
    keep = np.isfinite(a) & np.isfinite(b)
    return a[keep], b[keep]
