"""The DFlash campaign's learning curve (issue 32): held-out tau against optimizer steps'
sequences and against distinct training conversations, one row per measurement.

The table (`campaign.csv` beside a build's manifest) is written by `training.device_round`'s
records and the earlier rounds' manifests (`python -m plots campaign --csv FILE --out DIR`); this
module only reads it.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from plots.style import new_figure

COLUMNS = ["phase", "device", "step", "batch", "sequences_seen", "distinct_conversations", "heldout_tau"]


def load_campaign(path: str | Path) -> pd.DataFrame:
    table = pd.read_csv(path)
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"{path}: columns {missing} are missing; a campaign table has {', '.join(COLUMNS)}")
    return table


def campaign_figure(table: pd.DataFrame) -> Figure:
    """Left: tau against cumulative sequences trained on (each phase its own line, so a warm
    restart shows); right: the final tau of each phase against the distinct conversations it had."""
    fig, ((by_seen, by_data),) = new_figure(1, 2, panel_w=4.8, panel_h=3.4)
    for phase, rows in table.groupby("phase", sort=False):
        by_seen.plot(rows["sequences_seen"], rows["heldout_tau"], marker="o", ms=3, label=f"{phase} ({rows['device'].iloc[0]})")
    by_seen.set_xscale("log")
    by_seen.set_xlabel("sequences trained on (cumulative, log scale)")
    by_seen.set_ylabel("held-out tau (teacher-forced, 96 conv. x 64 anchors)")
    by_seen.legend(fontsize=7)
    ends = table.groupby("phase", sort=False).tail(1)
    by_data.plot(ends["distinct_conversations"], ends["heldout_tau"], marker="s", ls="--")
    for _, row in ends.iterrows():
        by_data.annotate(row["phase"], (row["distinct_conversations"], row["heldout_tau"]), fontsize=7,
                         textcoords="offset points", xytext=(4, -10))
    by_data.set_xlabel("distinct training conversations")
    by_data.set_ylabel("held-out tau at the end of the phase")
    fig.suptitle("SmolLM2-135M DFlash drafter: held-out tau vs training")
    return fig


def write_campaign_figure(csv: str | Path, out: str | Path) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fig = campaign_figure(load_campaign(csv))
    paths = [out / "campaign.png", out / "campaign.svg"]
    for path in paths:
        fig.savefig(path, bbox_inches="tight", dpi=130)
    return paths
