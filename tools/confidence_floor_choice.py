"""The confidence floor and draft length (`draft_confidence_floor`, `rule_draft_length`) a DFlash
drafter should serve with on a host: expected tokens/s at batch 1 over held-out blocks.

    python -m training.head_store --draft testbed/smollm2/round3/drafts/dflash \\
        --target .cache/targets/smollm2-135m-instruct --out .cache/head_store/heldout \\
        --data testbed/smollm2/data/heldout_regenerated.jsonl.gz --anchors 64 --seed 0
    python -m tools.confidence_floor_choice --store .cache/head_store/heldout \\
        --measurements testbed/smollm2/schedule/avx2/systems.measurements.json \\
        --out testbed/smollm2/round3/confidence_floor_choice/avx2.json

Each held-out block gives the drafter's top-1 token and probability at every slot and the true
continuation; a block drafted L tokens yields 1 + (leading slots right, at most L) tokens. A step
costs what `eval schedule` measured for the system at batch 1 (a line through its k = 1..K
costs: a verified slot costs the same whatever it holds; L = 0 by extrapolation, since the
drafter has run). The floor cuts each block where the product of its slots' probabilities falls
below it (draft_length.confident_cut); the best (floor, length) maximises tokens over cost,
printed beside every fixed length. Held-out blocks only: never evaluation prompts.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file

FLOORS = (0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2)
LENGTHS = (3, 4, 5, 7)


def held_out_blocks(store: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(leading slots right [N], the drafter's top-1 probability [N, S]) of every stored block."""
    lead, prob = [], []
    for shard in sorted(store.glob("shard_*.safetensors")):
        data = load_file(shard)
        right = data["candidate_ids"][:, :, 0] == data["targets"]
        lead.append(torch.cumprod(right.int(), 1).sum(1))
        prob.append(data["candidate_log_probs"][:, :, 0].float().exp())
    if not lead:
        raise SystemExit(f"--store {store}: no shard_*.safetensors (build it with training.head_store)")
    return torch.cat(lead), torch.cat(prob)


def batch_one_costs(measurements: Path, system: str) -> tuple[float, float, float]:
    """(plain step, a drafting step's cost at k = 1, each further slot's) in seconds at batch 1."""
    record = json.loads(measurements.read_text())
    costs = record["systems"][system]["step_costs_s"]
    ks = sorted(int(k) for k in costs if int(k) > 0)
    first, last = costs[str(ks[0])]["1"], costs[str(ks[-1])]["1"]
    slot = (last - first) / (ks[-1] - ks[0]) if ks[-1] > ks[0] else 0.0
    return record["AR_step_costs_s"]["1"], first - slot * (ks[0] - 1), slot


def speedup(lengths: torch.Tensor, lead: torch.Tensor, costs: tuple[float, float, float]) -> float:
    """Expected tokens/s over plain decoding's when block i drafts lengths[i] tokens."""
    plain, one, slot = costs
    tokens = 1 + torch.minimum(lead, lengths).float().mean()
    step = one + slot * (lengths.float().mean() - 1)
    return float(tokens / step * plain)


def cut_lengths(prob: torch.Tensor, floor: float, length: int) -> torch.Tensor:
    """Slots kept per block: those whose probability product stays at or above `floor`, at most `length`."""
    kept = (torch.cumprod(prob, 1) >= floor).int().cumprod(1).sum(1)
    return kept.clamp_max(length)


def choice(lead, prob, costs) -> dict:
    fixed = {n: speedup(torch.full_like(lead, n), lead, costs) for n in LENGTHS}
    cut = {(f, n): speedup(cut_lengths(prob, f, n), lead, costs) for f in FLOORS for n in LENGTHS}
    best = max(cut, key=cut.get)
    return {"fixed": {str(n): round(v, 4) for n, v in fixed.items()},
            "cut": {f"{f}/{n}": round(v, 4) for (f, n), v in cut.items()},
            "best": {"draft_confidence_floor": best[0], "rule_draft_length": best[1],
                     "speedup": round(cut[best], 4), "mean_length": round(float(
                         cut_lengths(prob, *best).float().mean()), 3)}}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, default=Path(".cache/head_store/heldout"))
    parser.add_argument("--measurements", type=Path, required=True,
                        help="an `eval schedule` measurements file (its batch-1 step costs)")
    parser.add_argument("--system", default="DFlash", help="whose step costs (default DFlash)")
    parser.add_argument("--out", type=Path, help="also write the table and the choice here (JSON)")
    args = parser.parse_args(argv)
    lead, prob = held_out_blocks(args.store)
    costs = batch_one_costs(args.measurements, args.system)
    result = choice(lead, prob, costs)
    print(f"{len(lead)} held-out blocks; batch-1 costs (ms): plain {costs[0] * 1e3:.1f}, "
          f"k = 1 {costs[1] * 1e3:.1f}, a further slot {costs[2] * 1e3:.2f}")
    print("fixed length:", "  ".join(f"{n}: {v}x" for n, v in result["fixed"].items()))
    for n in LENGTHS:
        print(f"cut, length {n}:", "  ".join(f"{f}: {result['cut'][f'{f}/{n}']}x" for f in FLOORS))
    print("best:", result["best"])
    if args.out is not None:
        store = json.loads((args.store / "store.json").read_text()) if (args.store / "store.json").exists() else {}
        record = {"store": str(args.store), "store_config": store, "measurements": str(args.measurements),
                  "system": args.system, "costs_s": dict(zip(("plain", "k1", "slot"), costs)), **result}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
