"""95% bootstrap intervals (plots.intervals): hand-computed cases, containment, shrinkage,
reproducibility, and the text every table prints."""

import math

import numpy as np
import pytest

from plots.intervals import Interval, mean_interval, pooled_speedup_interval, ratio_interval


def test_two_rows_give_their_extremes():
    """Resamples of [1, 3] have means 1 (p = 1/4), 2 (1/2), 3 (1/4): the 2.5th and 97.5th
    percentiles are the two rows themselves."""
    iv = mean_interval([1.0, 3.0])
    assert (iv.point, iv.low, iv.high, iv.n) == (2.0, 1.0, 3.0, 2)


def test_pooled_tau_is_the_draft_weighted_ratio_resampled_by_prompt():
    """accepted [2, 6] over drafts [2, 2]: tau = 1 + 8 / 4 = 3; resamples give 2, 3 or 4."""
    iv = ratio_interval([2, 6], [2, 2], offset=1.0)
    assert (iv.point, iv.low, iv.high) == (3.0, 2.0, 4.0)
    # Weighted by drafts: a prompt with 10x the drafts pulls the point to its own tau.
    assert ratio_interval([2, 60], [2, 20], offset=1.0).point == pytest.approx(1 + 62 / 22)


def test_paired_speedup_keeps_each_row_with_its_own_reference():
    """Every row runs at exactly 1.5x its own AR reference, at very different absolute speeds (a
    machine drifting during the job): the pooled ratio and all its resamples are 1.5."""
    tokens, wall = [48, 48, 48], [0.4, 1.0, 2.0]
    ref_tokens, ref_wall = [48, 48, 48], [0.6, 1.5, 3.0]
    iv = pooled_speedup_interval(tokens, wall, ref_tokens, ref_wall)
    assert iv.point == pytest.approx(1.5) and iv.low == pytest.approx(1.5) and iv.high == pytest.approx(1.5)


def test_interval_contains_the_point_and_shrinks_with_more_prompts():
    rng = np.random.default_rng(7)
    widths = []
    for n in (8, 32, 128):
        ratios = 1.2 + 0.2 * rng.standard_normal(n)
        iv = mean_interval(ratios)
        assert iv.low <= iv.point <= iv.high
        widths.append(iv.high - iv.low)
    assert widths[0] > widths[1] > widths[2]
    # The normal approximation: a 95% interval of a mean is about 2 * 1.96 * sd / sqrt(n).
    assert widths[2] == pytest.approx(2 * 1.96 * 0.2 / math.sqrt(128), rel=0.25)


def test_fixed_seed_makes_tables_reproducible():
    values = 1.2 + 0.2 * np.random.default_rng(3).standard_normal(20)
    assert mean_interval(values) == mean_interval(values)
    assert mean_interval(values, seed=1) != mean_interval(values)


def test_one_row_says_so_and_nothing_is_invented():
    iv = mean_interval([1.18])
    assert iv.n == 1 and math.isnan(iv.low) and iv.text(2, "×") == "1.18× (n=1, no interval)"
    assert Interval(1.18, 1.09, 1.27, 7).text(2, "×") == "1.18× [1.09, 1.27]"
    assert mean_interval([]).text() == "—"
    # NaN rows (a row whose speedup was not used) are not rows of the interval.
    assert mean_interval([1.0, math.nan, 3.0]).n == 2


def test_figure_error_bars_are_the_interval_around_each_cell():
    """plots.select.interval_errors: the bars of speedup_bars and the concurrency figures."""
    import pandas as pd

    from plots.select import interval_errors, seed_mean

    rows = pd.DataFrame({"system": ["A", "A", "B"], "seed": [0, 0, 0], "speedup": [1.0, 3.0, 1.5]})
    cells = seed_mean(rows, ["system"], "speedup")
    errors = interval_errors(rows, ["system"], "speedup", cells)
    assert errors.tolist() == [[1.0, 0.0], [1.0, 0.0]]  # A: 2 in [1, 3]; B: one row, no bar
