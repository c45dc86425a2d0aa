"""Speedup over AR per benchmark and system (paper Table 1 as bars)."""

import warnings

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from plots.figures.common import NotPlottable, colors_for, figure_legend
from plots.select import (format_temperature, interval_errors, ordered_unique, seed_mean, system_order,
                          target_label, without_baseline)
from plots.style import new_figure, styled

TITLE = "Speedup over autoregressive decoding"


@styled
def speedup_bars(runs: pd.DataFrame, colors: dict[str, str] | None = None) -> Figure:
    """Grouped bars: x benchmark, one bar per system, error bar = 95% bootstrap interval over the
    cell's rows (prompts; plots.intervals), none where a cell is one row.

    runs: kind == "run" rows at one setting per benchmark (plots.select.main_setting).
    Facets: one row of panels per target, one column per temperature. AR is the
    dashed line at 1x rather than a bar.
    """
    rows = without_baseline(runs)
    by = ["target", "temperature", "benchmark", "system"]
    cells = seed_mean(rows, by, "speedup")
    errors = interval_errors(rows, by, "speedup", cells)
    cells["err_low"], cells["err_high"] = errors[0], errors[1]
    if cells.empty:
        raise NotPlottable("no run rows with a speedup for a system other than AR")
    colors = colors_for(runs, colors)
    targets = ordered_unique(cells["target"])
    temperatures = sorted(ordered_unique(cells["temperature"]))
    benchmarks = ordered_unique(cells["benchmark"])
    systems = [s for s in system_order(rows) if s in set(cells["system"])]
    fig, axes = new_figure(len(targets), len(temperatures), panel_w=min(12.0, max(3.4, 1.0 + 0.22 * len(benchmarks) * len(systems))))
    width = 0.8 / len(systems)
    for r, target in enumerate(targets):
        for c, temperature in enumerate(temperatures):
            ax = axes[r][c]
            panel = cells[(cells["target"] == target) & (cells["temperature"] == temperature)]
            if panel.empty:
                ax.set_visible(False)
                continue
            shown = [b for b in benchmarks if b in set(panel["benchmark"])]
            x = np.arange(len(shown))
            for i, system in enumerate(systems):
                one = panel[panel["system"] == system].set_index("benchmark").reindex(shown)
                yerr = one[["err_low", "err_high"]].fillna(0.0).to_numpy().T
                # matplotlib 3.x tests a one-point (2, 1) error array with math.isfinite, which NumPy
                # deprecates; the bars are right, the warning is matplotlib's.
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", DeprecationWarning)
                    ax.bar(x + (i - (len(systems) - 1) / 2) * width, one["speedup"], width, yerr=yerr,
                           capsize=1.5, error_kw={"elinewidth": 0.8, "ecolor": "#222222"}, label=system,
                           color=colors[system])
            ax.axhline(1.0, color="#444444", linestyle="--", linewidth=1, label="AR (1×)")
            ax.set_xticks(x, shown, rotation=30, ha="right")
            ax.set_title(f"{target_label(target)}, {format_temperature(temperature)}")
            ax.set_xlabel("benchmark")
            ax.set_ylabel("speedup over AR (×)")
    fig.suptitle(f"{TITLE} (mean over seeds; bars: 95% interval over prompts)")
    figure_legend(fig, [ax for row in axes for ax in row], systems + ["AR (1×)"])
    return fig
