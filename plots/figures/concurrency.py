"""Throughput, speedup and tau as serving concurrency grows (paper Table 2 as figures)."""

import warnings

import pandas as pd
from matplotlib.figure import Figure

from plots.figures.common import NotPlottable, colors_for, figure_legend, require_single
from plots.select import interval_errors, ordered_unique, seed_mean, system_order, without_baseline
from plots.style import new_figure, styled

SERIES = ["benchmark", "input_len", "category"]
# metric -> (figure title, y label)
METRICS = {
    "tokens_per_s": ("Output throughput vs concurrency", "output tokens/s"),
    "speedup": ("Speedup over AR vs concurrency", "speedup over AR (×)"),
    "tau": ("Acceptance length τ vs concurrency", "acceptance length τ"),
}


def concurrency_sweep_rows(runs: pd.DataFrame) -> pd.DataFrame:
    """The run rows of every (target, temperature, benchmark, input length, category)
    that some system ran at two or more concurrencies."""
    keys = ["target", "temperature"] + SERIES
    n_levels = runs.groupby(keys + ["system"], sort=False)["concurrency"].transform("nunique")
    swept = runs.loc[n_levels > 1, keys].drop_duplicates()
    return runs.merge(swept, on=keys, how="inner")


@styled
def metric_vs_concurrency(runs: pd.DataFrame, metric: str = "tokens_per_s",
                          colors: dict[str, str] | None = None) -> Figure:
    """Lines of `metric` against concurrency (log2 axis), one per system.

    runs: fixed-setting run rows of one target and temperature. Panels: one row
    per (benchmark, input length), one column per category (entropy tier).
    Raises NotPlottable when no series has two or more concurrency levels.
    """
    if metric not in METRICS:
        raise ValueError(f"metric {metric!r} is not one of {sorted(METRICS)}")
    title, y_label = METRICS[metric]
    where = require_single(runs, ["target", "temperature"], "metric_vs_concurrency")
    swept = concurrency_sweep_rows(runs)
    if metric != "tokens_per_s":  # AR's tau and speedup are 1 by definition; a flat line says nothing
        swept = without_baseline(swept)
    cells = seed_mean(swept, SERIES + ["system", "concurrency"], metric)
    # Error bars: 95% bootstrap interval over each point's rows for tau and speedup (plots.intervals),
    # the std over seeds for tokens/s.
    if metric in ("tau", "speedup"):
        errors = interval_errors(swept, SERIES + ["system", "concurrency"], metric, cells)
        cells["err_low"], cells["err_high"] = errors[0], errors[1]
    else:
        cells["err_low"] = cells["err_high"] = cells[f"{metric}_std"]
    if cells.empty:
        levels = sorted(set(runs["concurrency"]))
        raise NotPlottable(f"no benchmark was run at more than one concurrency (levels present: {levels})")
    colors = colors_for(runs, colors)
    systems = [s for s in system_order(swept) if s in set(cells["system"])]
    row_keys = ordered_unique(zip(cells["benchmark"], cells["input_len"]))
    categories = ordered_unique(cells["category"])
    fig, axes = new_figure(len(row_keys), len(categories), panel_w=3.2, panel_h=2.5)
    for r, (benchmark, input_len) in enumerate(row_keys):
        for c, category in enumerate(categories):
            ax = axes[r][c]
            panel = cells[(cells["benchmark"] == benchmark) & (cells["input_len"] == input_len)
                          & (cells["category"] == category)]
            if panel.empty:
                ax.set_visible(False)
                continue
            for system in systems:
                line = panel[panel["system"] == system].sort_values("concurrency")
                if line.empty:
                    continue
                # matplotlib 3.x tests a one-point (2, 1) error array with math.isfinite, which NumPy
                # deprecates; the bars are right, the warning is matplotlib's.
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", DeprecationWarning)
                    ax.errorbar(line["concurrency"], line[metric],
                                yerr=line[["err_low", "err_high"]].fillna(0.0).to_numpy().T,
                                marker="o", markersize=3, capsize=2, label=system, color=colors[system])
            if metric == "speedup":
                ax.axhline(1.0, color="#444444", linestyle="--", linewidth=1, label="AR (1×)")
            levels = sorted(set(panel["concurrency"]))
            ax.set_xscale("log", base=2)
            ax.set_xticks(levels, [str(level) for level in levels])
            ax.minorticks_off()
            length = f"input {input_len}" if input_len else "natural input"
            ax.set_title(f"{benchmark}, {length}, {category or 'all'}")
            ax.set_xlabel("concurrency (max_num_seqs)")
            ax.set_ylabel(y_label)
    fig.suptitle(f"{title} — {where}" if where else title)
    order = systems + (["AR (1×)"] if metric == "speedup" else [])
    figure_legend(fig, [ax for row in axes for ax in row], order)
    return fig
