"""Decode-rule ablation: greedy walk vs exact (Viterbi) path (paper Table 12 as bars)."""

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from plots.figures.common import NotPlottable, figure_legend, require_single
from plots.select import ordered_unique, seed_mean
from plots.style import new_figure, styled

# A system name names its decode rule with one of these words, as its own token:
# "LiLiCorr-greedy" / "LiLiCorr-viterbi" (or "LiLiCorr (exact)") form one pair.
GREEDY_WORDS = ("greedy",)
EXACT_WORDS = ("viterbi", "exact")
_RULE = re.compile(r"(?i)(?:^|[-_ (])(" + "|".join(GREEDY_WORDS + EXACT_WORDS) + r")(?:$|[-_ )])")
COLORS = {"greedy": "#1f77b4", "exact": "#ff7f0e"}


@dataclass(frozen=True)
class DecodePair:
    base: str     # what the two systems share, e.g. "LiLiCorr"
    greedy: str   # system name of the greedy-walk arm
    exact: str    # system name of the exact (Viterbi) arm


def find_decode_pairs(systems: list[str], mapping: dict[str, str] | None = None) -> list[DecodePair]:
    """Pair systems by name: X-greedy with X-viterbi (or X-exact), case-insensitive.

    mapping: explicit {greedy system: exact system} pairs, used in addition to the
    name rule (for systems whose names do not follow it).
    """
    pairs, named = [], {}
    for greedy, exact in (mapping or {}).items():
        missing = [s for s in (greedy, exact) if s not in systems]
        if missing:
            raise ValueError(f"decode pair {greedy}={exact}: no system named {', '.join(missing)} in the results")
        pairs.append(DecodePair(greedy, greedy, exact))
    mapped = {s for p in pairs for s in (p.greedy, p.exact)}
    for system in systems:
        match = _RULE.search(system)
        if match is None or system in mapped:
            continue
        rule = "greedy" if match.group(1).lower() in GREEDY_WORDS else "exact"
        base = (system[: match.start()] + system[match.end():]).strip("-_ ()") or "head"
        named.setdefault(base, {}).setdefault(rule, system)
    pairs += [DecodePair(base, arms["greedy"], arms["exact"]) for base, arms in named.items() if len(arms) == 2]
    return pairs


@styled
def decode_ablation(runs: pd.DataFrame, pairs: list[DecodePair], value: str = "tau") -> Figure:
    """Bars of `value` per benchmark, greedy vs exact, Δ% above each pair; one panel per pair.

    runs: run rows of one target and temperature at one setting per benchmark.
    Δ = (exact - greedy) / greedy, so negative favors greedy.
    """
    where = require_single(runs, ["target", "temperature"], "decode_ablation")
    if not pairs:
        raise NotPlottable(
            "no greedy/exact system pair: name the arms X-greedy and X-viterbi (or X-exact), "
            "or pass --decode-pair GREEDY=EXACT"
        )
    panels = []
    for pair in pairs:
        cells = seed_mean(runs[runs["system"].isin([pair.greedy, pair.exact])], ["benchmark", "system"], value)
        table = cells.pivot(index="benchmark", columns="system", values=value)
        if pair.greedy in table and pair.exact in table:
            table = table[[pair.greedy, pair.exact]].dropna()
            benchmarks = [b for b in ordered_unique(runs["benchmark"]) if b in table.index]
            if benchmarks:
                panels.append((pair, table.loc[benchmarks]))
    if not panels:
        raise NotPlottable("the greedy and exact arms share no benchmark with a value for both")
    fig, axes = new_figure(1, len(panels), panel_w=max(3.4, 0.7 * max(len(t) for _, t in panels) + 1.2))
    for ax, (pair, table) in zip(axes[0], panels):
        x = np.arange(len(table))
        greedy, exact = table[pair.greedy].to_numpy(), table[pair.exact].to_numpy()
        ax.bar(x - 0.2, greedy, 0.4, label="greedy walk", color=COLORS["greedy"])
        ax.bar(x + 0.2, exact, 0.4, label="exact path (Viterbi)", color=COLORS["exact"])
        for xi, g, e in zip(x, greedy, exact):
            ax.annotate(f"{(e - g) / g * 100:+.1f}%", (xi, max(g, e)), textcoords="offset points",
                        xytext=(0, 2), ha="center", fontsize=7)
        ax.set_xticks(x, list(table.index), rotation=30, ha="right")
        ax.set_title(f"{pair.base}: {pair.greedy} vs {pair.exact}")
        ax.set_xlabel("benchmark")
        ax.set_ylabel({"tau": "acceptance length τ"}.get(value, value))
        ax.margins(y=0.12)
    title = "Decode-rule ablation (Δ = exact vs greedy)"
    fig.suptitle(f"{title} — {where}" if where else title)
    figure_legend(fig, axes[0])
    return fig
