"""Issue 33's one-change-at-a-time table of LiLiCorr head trainings, from their records.

    python -m tools.head_ablations testbed/smollm2/round3/lilicorr_head/ablation_*.json \
        --baseline testbed/smollm2/round3/lilicorr_head/w256_drop_wide66k_scale16_shipped.json

Each record is a `training.train_head` run (`run.json`: recipe, store, curve, plus the command);
the table has the baseline first, then one row per record naming the recipe fields it changed,
with its held-out walk tau and headroom share along training (every `eval_every` steps) and the
share on its own training blocks at the end (a gap between the two says overfitting). Every row
must share the baseline's held-out store: rows measured elsewhere are refused.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path


def changed_fields(recipe: dict, baseline: dict, prefix: str = "") -> dict:
    """Dotted recipe keys whose values differ from the baseline's (values of this recipe)."""
    changes = {}
    for key in sorted(set(recipe) | set(baseline)):
        mine, theirs = recipe.get(key), baseline.get(key)
        if isinstance(mine, dict) and isinstance(theirs, dict):
            changes.update(changed_fields(mine, theirs, f"{prefix}{key}."))
        elif mine != theirs:
            changes[f"{prefix}{key}"] = mine
    return changes


def row(record: dict, baseline: dict, steps: Sequence[int]) -> str:
    by_step = {point["step"]: point for point in record["curve"]}
    changes = changed_fields(record["recipe"], baseline["recipe"])
    if record.get("store") != baseline.get("store"):  # the training data, not the recipe
        changes["store"] = record.get("store")
    name = ", ".join(f"{k}={v}" for k, v in changes.items()) or "baseline (the shipped head)"
    cells = [f"{by_step[s]['walk_tau']:.3f} / {100 * by_step[s]['headroom_share']:.1f}%" if s in by_step else ""
             for s in steps]
    last = record["curve"][-1]
    return f"| {name} | " + " | ".join(cells) + f" | {100 * last.get('train_headroom_share', float('nan')):.1f}% |"


def table(records: list[dict], baseline: dict) -> str:
    steps = sorted({p["step"] for r in [baseline, *records] for p in r["curve"] if p["step"] > 0})
    lines = ["| change against the baseline | " + " | ".join(f"step {s:,}" for s in steps) + " | train share at the end |",
             "|---|" + "---|" * (len(steps) + 1)]
    lines += [row(r, baseline, steps) for r in [baseline, *records]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.head_ablations", description=__doc__.split("\n")[0])
    parser.add_argument("records", nargs="+", type=Path)
    parser.add_argument("--baseline", required=True, type=Path)
    args = parser.parse_args(argv)
    baseline = json.loads(args.baseline.read_text())
    records = [json.loads(p.read_text()) for p in args.records]
    stray = [str(p) for p, r in zip(args.records, records) if r["heldout"] != baseline["heldout"]]
    if stray:
        raise SystemExit(f"measured on another held-out store than the baseline's ({baseline['heldout']}): {stray}")
    print("held-out walk tau / share of the top-K headroom (argmax "
          f"{baseline['curve'][-1]['argmax_tau']:.3f}); {baseline['heldout']}")
    print(table(records, baseline))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
