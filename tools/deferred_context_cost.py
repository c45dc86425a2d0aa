"""The proposer's share of a k = 0 engine's time, with the deferred context of this checkout
against an earlier revision's (default 452927f: every completed KV block wrote all pending).

    source scripts/env.sh
    python -m tools.deferred_context_cost --concurrency 16 --batches 4 [--order new,old]

DFlash pinned to k = 0 serves --batches batches of 16 held-out prompts (~147 tokens: three
user turns each, eval's served prompts) for --tokens tokens at --concurrency, in one in-process
engine per rule. Printed per rule: the batches' wall time, and the time inside the context
writes, the scheduler hook (observe_schedule, patch 15) and the hand-over (keep_plain_step,
patch 14, writes included), each as a share of that wall. The shares are what this measures:
a second engine in one process ran ~35% slower than the first here, whichever rule it had
(the wall times are not comparable across rules; run each order).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from eval.schedule import HELDOUT, heldout_prompts, pinned, renderer, sampling
from eval.systems import load_systems, select_systems
from vllm_liliprop.vllm.offline import OfflineEngine, in_process_drafter

REPO = Path(__file__).resolve().parents[1]


def earlier_rule(revision: str) -> type:
    """That revision's DeferredContext, answering the scheduler hook as 'nothing parked'."""
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{revision}:vllm_liliprop/vllm/deferred_context.py"],
                            check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "earlier_deferred_context.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("earlier_deferred_context", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)

    class EarlierRule(module.DeferredContext):
        num_parked = num_revived_tokens = 0

        def depart(self, gone):
            self.keep_requests([rid for rid in self._batch if rid not in gone])

        def forget_blocks(self, block_ids):
            pass

        def hit_blocks(self, block_ids):
            return None

        def drop_parked(self):
            pass

    return EarlierRule


def timed(owner, name: str, spent: dict) -> None:
    """Wrap owner.name (an instance attribute) to add its seconds and calls to spent[name]."""
    method = getattr(owner, name)

    def wrapper(*args, **kwargs):
        began = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - began
    setattr(owner, name, wrapper)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--revision", default="452927f", help="the earlier deferred context's commit")
    p.add_argument("--order", default="old,new", help="which rule's engine is built first")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--target", default=str(REPO / ".cache/targets/smollm2-135m-instruct"))
    p.add_argument("--drafts", default=str(REPO / "testbed/smollm2/round3/drafts"))
    args = p.parse_args()
    flags = {"dtype": "bfloat16", "max_model_len": 2048, "enforce_eager": True}
    dflash = select_systems(load_systems(str(REPO / "testbed/smollm2/systems.json"), {"drafts": args.drafts}),
                            ["DFlash"])[0]
    texts = [prompt[0] for prompt in heldout_prompts(HELDOUT, 8 + 64)[8:]]
    batch = [["\n\n".join(texts[16 + 3 * i: 19 + 3 * i]) + "\n\nAnswer the last question."] for i in range(16)]
    render = renderer(args.target)
    with ExitStack() as stack:
        for rule in args.order.split(","):
            engine = stack.enter_context(OfflineEngine(
                args.target, flags, pinned(dflash.speculative_config, 0, args.concurrency), dflash.options(),
                max_num_seqs=args.concurrency))
            drafter = in_process_drafter(engine.llm)
            if rule == "old":
                drafter._deferred = earlier_rule(args.revision)(kv_block_size=drafter._deferred.kv_block_size)
            engine.run_batch(batch[:2], render, sampling(0.0, 8))
            spent = dict.fromkeys(("_write_context", "observe_schedule", "keep_plain_step"), 0.0)
            for name in spent:
                timed(drafter, name, spent)
            wall = sum(engine.run_batch(batch, render, sampling(0.0, args.tokens), concurrency=args.concurrency).wall_s
                       for _ in range(args.batches))
            shares = "; ".join(f"{name} {1e3 * s:.1f} ms = {100 * s / wall:.2f}%" for name, s in spent.items())
            print(f"{rule}: {args.batches} batches in {wall:.2f} s; {shares}", flush=True)


if __name__ == "__main__":
    main()
