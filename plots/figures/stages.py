"""Per-step time split into stages, stacked per system (paper Table 3 as bars)."""

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from plots.figures.common import NotPlottable, figure_legend, grid_shape, hide_unused, require_single
from plots.select import TOTAL_STAGE_PATTERN, ordered_unique, seed_mean, system_order
from plots.style import new_figure, styled

STAGE_COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
                "#9c755f", "#bab0ac"]
TOTAL_MARKER = "measured total"


@styled
def stage_bars(stages: pd.DataFrame) -> Figure:
    """Stacked bars of stage_ms per system, one panel per benchmark.

    stages: kind == "stage" rows of one target, temperature, concurrency and input
    length. Stages whose name says wall/total are the whole step: drawn as a black
    tick over the bar (so a gap shows untimed work), not stacked.
    """
    where = require_single(stages, ["target", "temperature", "concurrency", "input_len"], "stage_bars")
    cells = seed_mean(stages[stages["stage"] != ""], ["benchmark", "system", "stage"], "stage_ms")
    if cells.empty:
        raise NotPlottable("no kind == 'stage' rows with a stage name and stage_ms")
    names = ordered_unique(cells["stage"])
    parts = [s for s in names if not TOTAL_STAGE_PATTERN.search(s)]
    totals = [s for s in names if TOTAL_STAGE_PATTERN.search(s)]
    colors = {s: STAGE_COLORS[i % len(STAGE_COLORS)] for i, s in enumerate(parts)}
    benchmarks = ordered_unique(cells["benchmark"])
    systems = system_order(stages)
    n_rows, n_cols = grid_shape(len(benchmarks), max_cols=3)
    fig, axes = new_figure(n_rows, n_cols, panel_w=max(3.2, 0.7 * len(systems) + 1.0), panel_h=3.0)
    flat = [ax for row in axes for ax in row]
    for ax, benchmark in zip(flat, benchmarks):
        table = cells[cells["benchmark"] == benchmark].pivot(index="system", columns="stage", values="stage_ms")
        shown = [s for s in systems if s in table.index]
        table = table.reindex(index=shown)
        x = np.arange(len(shown))
        bottom = np.zeros(len(shown))
        for stage in parts:
            if stage not in table:
                continue
            heights = table[stage].fillna(0.0).to_numpy()
            ax.bar(x, heights, 0.6, bottom=bottom, label=stage, color=colors[stage])
            bottom += heights
        for stage in totals:
            if stage in table:
                ax.scatter(x, table[stage], marker="_", s=400, linewidths=2, color="black",
                           label=f"{stage} ({TOTAL_MARKER})", zorder=3)
        ax.set_xticks(x, shown, rotation=20, ha="right")
        ax.set_title(benchmark)
        ax.set_xlabel("system")
        ax.set_ylabel("ms per step")
    hide_unused(axes, len(benchmarks))
    title = "Per-step stage decomposition"
    fig.suptitle(f"{title} — {where}" if where else title)
    figure_legend(fig, flat, parts + [f"{s} ({TOTAL_MARKER})" for s in totals])
    return fig
