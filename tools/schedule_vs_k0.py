"""Each system's shipped schedule against the same system at k = 0 everywhere, beside plain
decoding, served as eval serves concurrency c (held-out prompts through c slots, T = 0, natural
ends), in interleaved rounds. It separates what falling back costs (k = 0 inside a speculative
engine) from what the schedule's drafting at smaller batches (a batch's tail) costs or gains.

    source scripts/env.sh; VLLM_CPU_KVCACHE_SPACE=1 \
        python -m tools.schedule_vs_k0 --only LiLiCorr-greedy,Domino,DFlash --concurrency 4 --rounds 4

Prints each round's tokens/s of every arm, then per arm its ratio to plain decoding's in the same
round: median, mean, range, and tau. Held-out prompts only (eval/schedule.py's served prompts), never benchmark prompts.
"""

from __future__ import annotations

import argparse
import statistics
from contextlib import ExitStack
from pathlib import Path

from eval.schedule import HELDOUT, heldout_prompts, interleaved, pinned, renderer, sampling, warm_up
from eval.systems import BASELINE, load_systems, select_systems

REPO = Path(__file__).resolve().parents[1]


def open_arms(stack: ExitStack, args, systems, flags) -> dict:
    """Plain decoding, and per system its schedule and its k = 0 copy, open together."""
    from vllm_liliprop.vllm.offline import OfflineEngine

    def engine(spec, options):
        return stack.enter_context(OfflineEngine(args.target, flags, spec, options,
                                                 max_num_seqs=args.concurrency))

    arms = {BASELINE: engine(None, None)}
    for s in systems:
        arms[s.name] = engine(s.speculative_config, s.options())
        arms[s.name.replace("-scheduled", "-k0")] = engine(
            pinned(s.speculative_config, 0, args.concurrency), s.options())
    return arms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", required=True, metavar="A,B", help="systems whose <name>-scheduled to serve")
    p.add_argument("--systems", default=str(REPO / "testbed/smollm2/schedule/systems.json"))
    p.add_argument("--drafts", default=str(REPO / "testbed/smollm2/round3/drafts"))
    p.add_argument("--target", default=str(REPO / ".cache/targets/smollm2-135m-instruct"))
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--prompts", type=int, default=16, help="held-out prompts a round (after the first 8)")
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--dtype", default="bfloat16")
    args = p.parse_args()
    systems = select_systems(load_systems(args.systems, {"drafts": args.drafts}),
                             [n + "-scheduled" for n in args.only.split(",")])
    flags = {"dtype": args.dtype, "max_model_len": 2048, "enforce_eager": True}
    prompts = heldout_prompts(HELDOUT, 8 + args.prompts)[8:]  # eval schedule's served prompts
    render = renderer(args.target)

    def rate(engine, batch) -> float:
        result = engine.run_batch(batch, render, sampling(0.0, args.tokens, ignore_eos=False),
                                  concurrency=args.concurrency)
        return result.output_tokens / result.wall_s

    with ExitStack() as stack:
        arms = open_arms(stack, args, systems, flags)
        warm_up(arms, prompts, render, 0.0, 8)
        # k None: every arm serves its own config (schedule, pinned k = 0, or plain decoding).
        rates = interleaved(arms, [(name, None) for name in arms], {args.concurrency: prompts}, rate,
                            args.rounds, print, "served tokens/s")
        taus = {name: engine.counters().tau for name, engine in arms.items() if name != BASELINE}
    plain = rates[BASELINE][None][args.concurrency]
    for name, by_k in rates.items():
        ratios = [x / y for x, y in zip(by_k[None][args.concurrency], plain)]
        print(f"{name:28s} over plain decoding: median {statistics.median(ratios):.3f} mean "
              f"{statistics.mean(ratios):.3f} range {min(ratios):.3f}-{max(ratios):.3f} "
              f"tau {taus.get(name, 1.0):.2f}")


if __name__ == "__main__":
    main()
