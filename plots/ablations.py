"""The ablation summary (issue 18): each ablation's paper direction next to ours, from one results file.

An ablation spec (JSON; testbed/smollm2/ablations.json is the real target's) lists comparisons
of two systems of the results file:

    {"comparisons": [{"ablation": "...", "source": "LiLiCorr Table 12",
                      "baseline": "LiLiCorr-greedy", "variant": "LiLiCorr-viterbi",
                      "paper": "-", "paper_effect": "-2.44%"}, ...]}

A system is its name, or {"system": NAME, "dels_alpha": A, "dels_beta": B} for one cell of a
system run over a DeLS grid (`dels_grid`, whose rows share the name).

`paper` is the direction of the variant's acceptance length against the baseline's in the
paper ("+" longer, "-" shorter, "=" no change, "n/a" not measured there). Ours is read off
the pooled (block-weighted) tau of each system over every row of the results file: "+" or "-"
when the change exceeds `tolerance` (relative, 1% by default: about one standard error of tau
over a set of ~2,000 blocks such as the 48 held-out prompts x 64 tokens of the real target's
run; greedy tau itself is deterministic), "=" otherwise. A comparison agrees when the directions match.

A comparison whose baseline or variant has no rows in the results (a system not run yet) is
shown as "not measured" (its measured side keeps its tau); the table's notes name the systems
with no rows, so a misspelt name in the spec shows there.
"""

import json
import math
from pathlib import Path

import pandas as pd

from plots.tables import Table, TableRow, pooled_value

DIRECTIONS = ("+", "-", "=", "n/a")
TOLERANCE = 0.01


def load_ablation_spec(path: str | Path) -> dict:
    path = Path(path)
    try:
        spec = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"ablation spec {path}: {error}") from None
    comparisons = spec.get("comparisons") if isinstance(spec, dict) else None
    if not isinstance(comparisons, list) or not comparisons:
        raise ValueError(f"ablation spec {path} needs a non-empty 'comparisons' list")
    for i, entry in enumerate(comparisons):
        missing = [k for k in ("ablation", "baseline", "variant", "paper") if k not in entry]
        if missing:
            raise ValueError(f"{path}: comparisons[{i}] lacks {missing}")
        if entry["paper"] not in DIRECTIONS:
            raise ValueError(f"{path}: comparisons[{i}].paper = {entry['paper']!r}; use one of {DIRECTIONS}")
    return spec


def system_label(system) -> str:
    if isinstance(system, str):
        return system
    return f"{system['system']} (α {system['dels_alpha']:g}, β {system['dels_beta']:g})"


class NotMeasured(ValueError):
    """The results have no rows of a system."""


def system_tau(df: pd.DataFrame, system) -> float:
    """Block-weighted tau of `system` (a name or a grid cell) over all its run rows; NotMeasured
    (a ValueError) if it has none, ValueError if a plain name covers several DeLS grid cells."""
    name = system if isinstance(system, str) else system["system"]
    keep = df["system"] == name
    if "kind" in df.columns:
        keep &= df["kind"] == "run"
    weights = df[["dels_alpha", "dels_beta"]].apply(pd.to_numeric, errors="coerce")
    if not isinstance(system, str):
        for key in ("dels_alpha", "dels_beta"):
            keep &= (weights[key] - float(system[key])).abs() < 1e-9
    rows = df[keep]
    if rows.empty:
        raise NotMeasured(f"the results have no rows of system {system_label(system)!r}; run it or fix "
                          "the ablation spec")
    if isinstance(system, str) and len(weights[keep].drop_duplicates()) > 1:
        raise ValueError(f"system {name!r} was run over a DeLS grid; name one cell as "
                         '{"system": ..., "dels_alpha": A, "dels_beta": B}')
    tau = pooled_value(rows, "tau", None)
    if math.isnan(tau) and len(rows) == 1:
        # One measurement without acceptance counters (a build's held-out tau,
        # training/build_stages/heldout_table.py): its tau is the pooled value.
        return float(rows["tau"].iloc[0])
    return tau


def direction(change: float, tolerance: float = TOLERANCE) -> str:
    if math.isnan(change):
        return "n/a"
    return "=" if abs(change) <= tolerance else ("+" if change > 0 else "-")


def ablation_table(df: pd.DataFrame, spec: dict, tolerance: float = TOLERANCE) -> Table:
    rows, unmeasured = [], []

    def measured_tau(system) -> float:
        try:
            return system_tau(df, system)
        except NotMeasured:
            if system_label(system) not in unmeasured:
                unmeasured.append(system_label(system))
            return math.nan

    for entry in spec["comparisons"]:
        base, variant = measured_tau(entry["baseline"]), measured_tau(entry["variant"])
        change = variant / base - 1.0
        ours = direction(change, tolerance)
        paper = entry["paper"]
        agrees = "—" if paper == "n/a" or ours == "n/a" else ("yes" if paper == ours else "no")
        paper_text = paper + (f" ({entry['paper_effect']})" if entry.get("paper_effect") else "")
        change_text = "not measured" if math.isnan(change) else f"{100 * change:+.2f}%"
        rows.append(TableRow([entry["ablation"], entry.get("source", ""), f"{system_label(entry['variant'])} vs {system_label(entry['baseline'])}"],
                             [base, variant], extras=[change_text, paper_text, ours, agrees],
                             bold=False))
    table = Table(["Ablation", "Source", "Variant vs baseline"], ["τ baseline", "τ variant"], rows, 3,
                  extra_header=["Change", "Paper", "Ours", "Agrees"])
    table.caption = "ablations: acceptance length τ of each variant against its baseline, the paper's direction and ours"
    table.notes = [f"τ pooled over every prompt of the results (block-weighted); our direction is '=' within "
                   f"±{100 * tolerance:.1f}%, about one standard error of τ over ~2,000 blocks."]
    if unmeasured:
        table.notes.append(f"not measured (no rows in the results): {', '.join(unmeasured)}; run them, "
                           "or check the names in the ablation spec.")
    return table
