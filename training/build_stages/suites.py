"""Stage "suites" of the offline testbed: held-out eval suites for `python -m eval run --data-dir
OUT/eval`: testbed/code, testbed/chat and testbed/entropy (low / mixed / high tertiles of the
target's mean per-token entropy over its own greedy continuation; category = tier)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from training.build_stages.jsonl import write_jsonl

__all__ = ["TIERS", "continuation_entropies", "entropy_tiers", "suites_stage"]

TIERS = ("low", "mixed", "high")


@torch.no_grad()
def continuation_entropies(model, dataset) -> list[float]:
    """Mean entropy (nats) of the target's next-token distribution at each loss-masked position
    of every example of a TokenizedDataset; NaN for an example without supervised tokens."""
    out = []
    for i in range(len(dataset)):
        example = dataset[i]
        ids = torch.tensor([example.input_ids])
        logits = model(input_ids=ids).logits[0, :-1].float()
        entropy = -(logits.log_softmax(-1) * logits.softmax(-1)).sum(-1)
        mask = torch.tensor(example.loss_mask[1:])
        out.append(float(entropy[mask].mean()) if mask.any() else float("nan"))
    return out


def entropy_tiers(entropies: list[float], per_tier: int) -> dict[str, list[int]]:
    """Tertiles of the finite entropies (ascending): {"low", "mixed", "high"} -> up to per_tier
    indices each, taken from the middle of the tertile so the tiers stay apart."""
    order = sorted((e, i) for i, e in enumerate(entropies) if math.isfinite(e))
    if len(order) < 3:
        raise ValueError(f"{len(order)} held-out continuations cannot form 3 entropy tiers; "
                         "raise suites.entropy_per_tier")
    bounds = [round(t * len(order) / 3) for t in range(4)]
    tiers = {}
    for t, name in enumerate(TIERS):
        part = order[bounds[t]:bounds[t + 1]]
        start = max(0, (len(part) - per_tier) // 2)
        tiers[name] = sorted(i for _, i in part[start:start + per_tier])
    return tiers


def suites_stage(target, heldout_prompts: list[dict], heldout_data, spec: dict, suite_dir: Path) -> dict[str, Any]:
    """heldout_data[i] is the target's greedy continuation of heldout_prompts[i] (tokenized with
    min_supervised=0, so the two align). The first spec["code"] / spec["chat"] prompts of each
    kind form those suites; the rest are ranked by entropy into spec["entropy_per_tier"] per tier.

    Writes suite_dir/{code,chat,entropy}.jsonl; returns {"suites": {name: rows},
    "entropy_tier_mean": {tier: mean entropy}}.
    """
    if len(heldout_data) != len(heldout_prompts):
        raise ValueError(f"{len(heldout_data)} tokenized continuations for {len(heldout_prompts)} held-out prompts")
    entropies = continuation_entropies(target, heldout_data)
    kinds = {kind: [i for i, p in enumerate(heldout_prompts) if p["kind"] == kind] for kind in ("code", "chat")}

    def row(i: int) -> dict:
        return {"id": heldout_prompts[i]["id"], "turns": [heldout_prompts[i]["messages"][0]["content"]]}

    suite_rows = {kind: [row(i) for i in kinds[kind][: spec[kind]]] for kind in ("code", "chat")}
    rest = [i for kind in ("code", "chat") for i in kinds[kind][spec[kind]:]]
    tiers = entropy_tiers([entropies[i] for i in rest], spec["entropy_per_tier"])
    suite_rows["entropy"] = [{**row(rest[j]), "category": tier, "entropy": round(entropies[rest[j]], 4)}
                             for tier in TIERS for j in tiers[tier]]
    for name, rows in suite_rows.items():
        write_jsonl(suite_dir / f"{name}.jsonl", rows)
    return {"suites": {name: len(rows) for name, rows in suite_rows.items()},
            "entropy_tier_mean": {tier: round(sum(entropies[rest[j]] for j in tiers[tier]) / len(tiers[tier]), 4)
                                  for tier in TIERS}}
