"""Exported LiLiCorr heads measured on head stores: walk tau, argmax tau, oracle-prefix tau at the
head's K and the walk's share of that headroom (`training.train_head.lattice_metrics`), one row
per (draft, store). A store the head never trained on, from the head's own training
distribution, tells overfitting (train >> it) from a shift to the held-out set (it >> held-out).

    python -m training.head_eval --draft testbed/smollm2/round3/drafts/lilicorr .cache/heads/base/lilicorr \\
        --store .cache/head_store/heldout .cache/head_store/unseen --target .cache/targets/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file

from training.export import load_lilicorr
from training.head_store import first_slots, load_store
from training.train_head import lattice_metrics
from vllm_liliprop.quiet import add_verbose_flag, quiet_after_parse

__all__ = ["evaluate", "main"]


def evaluate(drafts: Sequence[str], stores: Sequence[str], embed: torch.Tensor,
             slots: int | None = None, scored_slots: int | None = None) -> list[dict]:
    """One row per (draft, store): its metrics (a draft's prior weight is in its head's config),
    on lattices of the stores' first `slots` slots (the served k; None: every slot), counting
    the walk's first `scored_slots` picks (None: all of the lattice's)."""
    loaded = {store: first_slots(load_store(store), slots) for store in stores}
    rows = []
    for draft in drafts:
        _, head = load_lilicorr(draft)
        for store, blocks in loaded.items():
            rows.append({"draft": draft, "store": store, "slots": blocks["targets"].shape[1],
                         "scored_slots": scored_slots or blocks["targets"].shape[1],
                         **lattice_metrics(head, blocks, embed, scored_slots=scored_slots)})
    return rows


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m training.head_eval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draft", nargs="+", required=True, help="exported LiLiCorr draft folders")
    parser.add_argument("--store", nargs="+", required=True, help="head stores (training.head_store)")
    parser.add_argument("--target", required=True, help="the target's folder (its embedding table)")
    parser.add_argument("--slots", type=int, default=None,
                        help="measure lattices of the first N slots, as k = N speculative tokens serve them")
    parser.add_argument("--scored-slots", type=int, default=None,
                        help="count only the walk's first N picks (the lattice keeps --slots): what a "
                             "longer lattice than the engine verifies would draft")
    parser.add_argument("--json", default=None, help="also write the rows here")
    add_verbose_flag(parser)
    args = parser.parse_args(argv)
    quiet_after_parse(args)  # libraries at WARNING unless --verbose
    embed = load_file(str(Path(args.target) / "model.safetensors"))["model.embed_tokens.weight"]
    rows = evaluate(args.draft, args.store, embed, args.slots, args.scored_slots)
    for row in rows:
        print(json.dumps(row))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()
