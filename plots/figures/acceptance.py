"""Acceptance rate at each draft position (from the accept_per_pos lists)."""

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from plots.figures.common import NotPlottable, colors_for, figure_legend, grid_shape, hide_unused, require_single
from plots.select import mean_accept_per_pos, ordered_unique, system_order
from plots.style import new_figure, styled

TITLE = "Acceptance rate per draft position"


@styled
def accept_per_position(runs: pd.DataFrame, colors: dict[str, str] | None = None) -> Figure:
    """One panel per benchmark, one line per system: mean acceptance rate at position 1..k.

    runs: run rows of one target and temperature at one setting per benchmark.
    Lists are averaged elementwise, per seed first (plots.select.mean_accept_per_pos).
    """
    where = require_single(runs, ["target", "temperature"], "accept_per_position")
    rows = runs[np.array([len(v) > 0 for v in runs["accept_per_pos"]], dtype=bool)]
    if rows.empty:
        raise NotPlottable("no run row has an accept_per_pos list (AR rows have none)")
    colors = colors_for(runs, colors)
    benchmarks = ordered_unique(rows["benchmark"])
    systems = system_order(rows)
    n_rows, n_cols = grid_shape(len(benchmarks))
    fig, axes = new_figure(n_rows, n_cols, panel_w=3.0, panel_h=2.4, sharey=True)
    flat = [ax for row in axes for ax in row]
    for ax, benchmark in zip(flat, benchmarks):
        for system in systems:
            rates = mean_accept_per_pos(rows[(rows["benchmark"] == benchmark) & (rows["system"] == system)])
            if rates.size == 0:
                continue
            ax.plot(np.arange(1, rates.size + 1), rates, marker="o", markersize=3, label=system,
                    color=colors[system])
        ax.set_title(benchmark)
        ax.set_xlabel("draft position")
        ax.set_ylabel("acceptance rate")
        ax.set_ylim(0.0, 1.02)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    hide_unused(axes, len(benchmarks))
    fig.suptitle(f"{TITLE} — {where}" if where else TITLE)
    figure_legend(fig, flat, systems)
    return fig
