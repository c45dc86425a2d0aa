"""One look for every figure, and byte-stable output.

SVG files are identical across runs and machines with the same matplotlib:
a fixed svg.hashsalt makes element ids stable, metadata carries no date, and
text is drawn as paths from the bundled DejaVu Sans font.
"""

import functools
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure

from plots.select import is_baseline

STYLE = {
    "svg.hashsalt": "vllm-liliprop",
    "svg.fonttype": "path",
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.titlesize": 9,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "savefig.dpi": 110,
    "image.cmap": "viridis",
}
PNG_METADATA = {"Software": "vllm-liliprop plots"}
SVG_METADATA = {"Creator": "vllm-liliprop plots", "Date": None}
BASELINE_COLOR = "#444444"
MIN_WIDTH = 7.5  # inches
CYCLE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
         "#bcbd22", "#7f7f7f"]


def styled(build):
    """Decorator: run a figure builder under STYLE, so its text and colors use it."""
    @functools.wraps(build)
    def wrapper(*args, **kwargs):
        with matplotlib.rc_context(STYLE):
            return build(*args, **kwargs)
    return wrapper


def new_figure(n_rows: int, n_cols: int, panel_w: float = 3.4, panel_h: float = 2.6,
               extra_h: float = 0.9, sharey: bool | str = False) -> tuple[Figure, list[list]]:
    """A constrained-layout Figure (no pyplot, so nothing global) with an n_rows x n_cols grid of axes."""
    # At least MIN_WIDTH wide so a one-panel figure still fits its suptitle and legend.
    fig = Figure(figsize=(max(MIN_WIDTH, panel_w * n_cols + 0.6), panel_h * n_rows + extra_h), layout="constrained")
    axes = fig.subplots(n_rows, n_cols, squeeze=False, sharey=sharey)
    return fig, [list(row) for row in axes]


def system_colors(systems: list[str]) -> dict[str, str]:
    """Fixed color per system: the AR baseline gray, the rest in order from CYCLE."""
    colors, i = {}, 0
    for system in systems:
        if is_baseline(system):
            colors[system] = BASELINE_COLOR
        else:
            colors[system] = CYCLE[i % len(CYCLE)]
            i += 1
    return colors


def save_figure(fig: Figure, out_dir: Path, stem: str) -> list[Path]:
    """Write stem.png and stem.svg under out_dir; returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    png, svg = out_dir / f"{stem}.png", out_dir / f"{stem}.svg"
    with matplotlib.rc_context(STYLE):
        fig.savefig(png, format="png", metadata=PNG_METADATA)
        fig.savefig(svg, format="svg", metadata=SVG_METADATA)
    return [png, svg]
