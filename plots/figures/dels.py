"""DeLS fusion-weight sweep: tau over the (alpha, beta) grid (DeLS-Spec paper Figure 2)."""

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure

from plots.figures.common import NotPlottable, require_single
from plots.select import ordered_unique, seed_mean
from plots.style import new_figure, styled

SWEEP_KEYS = ["target", "system", "temperature", "concurrency", "input_len"]


@dataclass
class SweepGrid:
    values: pd.DataFrame  # index dels_alpha (ascending), columns dels_beta (ascending); NaN = not measured
    benchmarks: list[str]  # the benchmarks averaged into each cell
    notes: list[str] = field(default_factory=list)


def sweep_grid(sweep: pd.DataFrame, value: str = "tau") -> SweepGrid:
    """Mean `value` per (alpha, beta) over seeds and over the benchmarks that cover the grid.

    sweep: run rows of one system at one setting with several (dels_alpha, dels_beta).
    Averaging over benchmarks with different grid points would compare unlike
    means, so only the benchmarks measured at every point of the best-covered
    benchmark's grid are used; the others are named in notes.
    """
    rows = sweep[sweep["dels_alpha"].notna() & sweep["dels_beta"].notna()]
    cells = seed_mean(rows, ["benchmark", "dels_alpha", "dels_beta"], value)
    if cells.empty:
        raise NotPlottable(f"no sweep row has dels_alpha, dels_beta and {value}")
    covered = {b: set(zip(g["dels_alpha"], g["dels_beta"])) for b, g in cells.groupby("benchmark", sort=False)}
    reference = max(covered.values(), key=len)
    used = [b for b in ordered_unique(cells["benchmark"]) if covered[b] >= reference]
    notes = [
        f"{b} left out of the heatmap: measured at {len(covered[b])} of the {len(reference)} grid points"
        for b in covered if b not in used
    ]
    on_grid = cells[cells["benchmark"].isin(used)]
    on_grid = on_grid[[p in reference for p in zip(on_grid["dels_alpha"], on_grid["dels_beta"])]]
    grid = on_grid.groupby(["dels_alpha", "dels_beta"])[value].mean().unstack("dels_beta")
    grid = grid.reindex(index=sorted(set(cells["dels_alpha"])), columns=sorted(set(cells["dels_beta"])))
    return SweepGrid(grid, used, notes)


@styled
def dels_heatmap(sweep: pd.DataFrame, value: str = "tau") -> Figure:
    """Heatmap of `value` over alpha (rows) x beta (columns), annotated per cell.

    With a beta = 0 column, two more panels as in the paper: each row minus its
    beta = 0 value, and per alpha the gain of the best beta > 0 over beta = 0.
    """
    where = require_single(sweep, SWEEP_KEYS, "dels_heatmap")
    pairs = sweep[["dels_alpha", "dels_beta"]].dropna().drop_duplicates()
    if len(pairs) < 2:
        raise NotPlottable("no (dels_alpha, dels_beta) sweep: every DeLS row has the same fusion weights")
    grid = sweep_grid(sweep, value)
    alphas, betas = list(grid.values.index), list(grid.values.columns)
    has_zero = 0.0 in betas and len(betas) > 1
    fig, axes = new_figure(1, 3 if has_zero else 1, panel_w=4.0, panel_h=3.2)
    label = {"tau": "acceptance length τ"}.get(value, value)
    ax = axes[0][0]
    _heatmap(fig, ax, grid.values.to_numpy(), alphas, betas, "viridis", None, label)
    ax.set_title(f"{label} over (α, β)")
    if has_zero:
        delta = grid.values.sub(grid.values[0.0], axis=0).to_numpy()
        limit = float(np.nanmax(np.abs(delta))) or 1.0
        ax = axes[0][1]
        _heatmap(fig, ax, delta, alphas, betas, "RdBu", TwoSlopeNorm(0.0, -limit, limit), f"Δ {label} vs β = 0")
        ax.set_title("row minus its β = 0 value")
        ax = axes[0][2]
        positive = grid.values[[b for b in betas if b > 0]]
        gain = positive.max(axis=1) - grid.values[0.0]
        ax.bar(np.arange(len(alphas)), gain.to_numpy(), color="#2ca02c")
        ax.axhline(0.0, color="#444444", linewidth=1)
        ax.set_xticks(np.arange(len(alphas)), [f"{a:g}" for a in alphas])
        ax.set_xlabel("α (local-head weight)")
        ax.set_ylabel(f"best β > 0 minus β = 0 ({value})")
        ax.set_title("gain of the best β over β = 0")
    title = f"DeLS fusion-weight sweep, mean over {', '.join(grid.benchmarks)}"
    fig.suptitle(f"{title} — {where}" if where else title)
    return fig


def _heatmap(fig, ax, values: np.ndarray, alphas, betas, cmap: str, norm, label: str) -> None:
    image = ax.imshow(np.ma.masked_invalid(values), origin="lower", cmap=cmap, norm=norm, aspect="auto")
    for i in range(len(alphas)):
        for j in range(len(betas)):
            if not np.isnan(values[i, j]):
                # dark text on light cells, light text on dark ones
                red, green, blue, _ = image.cmap(image.norm(values[i, j]))
                dark_cell = 0.299 * red + 0.587 * green + 0.114 * blue < 0.5
                ax.text(j, i, f"{values[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if dark_cell else "black")
    ax.set_xticks(np.arange(len(betas)), [f"{b:g}" for b in betas])
    ax.set_yticks(np.arange(len(alphas)), [f"{a:g}" for a in alphas])
    ax.set_xlabel("β (unigram-prior weight)")
    ax.set_ylabel("α (local-head weight)")
    ax.grid(False)
    fig.colorbar(image, ax=ax, label=label, shrink=0.9)
