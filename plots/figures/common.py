"""Helpers shared by the figure builders."""

import pandas as pd
from matplotlib.figure import Figure

from plots.select import describe, system_order
from plots.style import system_colors


class NotPlottable(ValueError):
    """The rows cannot support this figure; the message says what is missing."""


def require_single(rows: pd.DataFrame, columns: list[str], figure: str) -> str:
    """Check the rows hold one value of each column; return the title suffix naming them.

    Raises ValueError when a column varies: the caller must split the rows first
    (plots.select.split_by), so no figure silently averages over targets or settings.
    """
    values = {}
    for column in columns:
        distinct = list(dict.fromkeys(rows[column]))
        if len(distinct) > 1:
            raise ValueError(
                f"{figure}: rows hold {len(distinct)} values of {column!r} ({distinct[:4]}); "
                f"split them first with plots.select.split_by"
            )
        if distinct:
            values[column] = distinct[0]
    return describe(values)[1]


def colors_for(rows: pd.DataFrame, colors: dict[str, str] | None) -> dict[str, str]:
    palette = system_colors(system_order(rows))
    if colors:
        palette.update(colors)
    return palette


def figure_legend(fig: Figure, axes, order: list[str] | None = None, title: str | None = None) -> None:
    """One legend for the whole figure from every axes' labeled artists, in `order` when given."""
    by_label = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            by_label.setdefault(label, handle)
    labels = [l for l in (order or []) if l in by_label] + [l for l in by_label if l not in (order or [])]
    if labels:
        fig.legend([by_label[l] for l in labels], labels, loc="outside lower center", ncols=min(len(labels), 5),
                   title=title, frameon=False)


def hide_unused(axes_grid, used: int) -> None:
    flat = [ax for row in axes_grid for ax in row]
    for ax in flat[used:]:
        ax.set_visible(False)


def grid_shape(n_panels: int, max_cols: int = 4) -> tuple[int, int]:
    n_cols = min(n_panels, max_cols)
    return (n_panels + n_cols - 1) // n_cols, n_cols
