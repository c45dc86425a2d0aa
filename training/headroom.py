"""`python -m training.headroom`: the headroom table of one exported draft (issue 33).

Teacher-forced on held-out data, on the measure stage's anchors (same example indices, anchor
count and seed, so its argmax and walk rows are the stage's taus): the argmax's tau, the
LiLiCorr walk's, the oracle-prefix tau at K = 1..16 (the true token picked whenever the drafter
ranked it within its top K), the walk's share of each K's headroom, and the argmax's per-slot
conditional acceptance (training.headroom_metrics says how each is counted).

    python -m training.headroom --draft DIR [--lilicorr] --target DIR --data heldout.jsonl \
        --anchors 64 --seed 0 [--limit N] [--json out.json]

--data is a tokenized set (training.data's {"input_ids", "loss_mask"} JSONL) or conversations
({"id", "messages"} JSONL, gzipped or not), which are tokenized here with the target's chat
template as the realbed's tokenize stage does (max length 1024, examples with fewer than two
supervised tokens dropped), so a held-out snapshot file reproduces the build's held-out set.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from training.build_stages.measure import drafter_acceptance
from training.data import TokenizedDataset, load_examples
from training.headroom_metrics import headroom_table, rounded

__all__ = ["main"]

MAX_LENGTH = 1024  # the SmolLM2 build's max_model_len, which its tokenize stage cuts to


def _first(dataset: TokenizedDataset, limit: int | None) -> TokenizedDataset:
    """The first `limit` examples, keeping their indices (and so their anchor seeds)."""
    if limit is None:
        return dataset
    return TokenizedDataset(dataset.input_ids[:limit], dataset.loss_masks[:limit])


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m training.headroom", description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft", required=True, help="exported draft folder (DFlash or LiLiCorr)")
    parser.add_argument("--lilicorr", action="store_true", help="the draft is LiLiCorr: also the walk's rows")
    parser.add_argument("--target", required=True, help="the target's Hugging Face folder")
    parser.add_argument("--data", required=True, help="held-out set: tokenized JSONL or conversations (.jsonl[.gz])")
    parser.add_argument("--anchors", type=int, default=64, help="anchors per example (the measure stage's)")
    parser.add_argument("--seed", type=int, default=0, help="anchor seed (the build's)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N examples")
    parser.add_argument("--json", default=None, help="also write the metrics here")
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM

    dataset = _first(load_examples(args.data, args.target, MAX_LENGTH), args.limit)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    measured = drafter_acceptance(Path(args.draft), args.lilicorr, target, dataset, args.anchors, args.seed)
    metrics = {"draft": str(args.draft), "data": str(args.data), "examples": len(dataset),
               "anchors_per_example": args.anchors, "seed": args.seed, **rounded(measured["headroom"])}
    print(headroom_table(measured["headroom"]))
    if args.json:
        Path(args.json).write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


if __name__ == "__main__":
    main()
