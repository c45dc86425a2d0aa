"""Each system's shipped schedule against the same system at k = 0 everywhere, beside plain
decoding, served as eval serves concurrency c (held-out prompts through c slots, T = 0, natural
ends), in interleaved rounds. It separates what falling back costs (k = 0 inside a speculative
engine) from what the schedule's drafting at smaller batches (a batch's tail) costs or gains.

    python -m tools.schedule_vs_k0 --only LiLiCorr-greedy,Domino,DFlash --concurrency 4 --rounds 4

Prints each round's tokens/s over plain decoding's, then per arm the median, mean, range and
tau. Held-out prompts only (eval/schedule.py's served prompts), never benchmark prompts.
"""

from __future__ import annotations

import argparse
import statistics
from contextlib import ExitStack
from pathlib import Path

from eval.schedule import HELDOUT, heldout_prompts, pinned, renderer, sampling
from eval.systems import load_systems, select_systems

REPO = Path(__file__).resolve().parents[1]


def open_arms(stack: ExitStack, args, systems, flags) -> dict:
    """Plain decoding, and per system its schedule and its k = 0 copy, open together."""
    from vllm_liliprop.vllm.offline import OfflineEngine

    def engine(spec, options):
        return stack.enter_context(OfflineEngine(args.target, flags, spec, options,
                                                 max_num_seqs=args.concurrency))

    arms = {"AR": engine(None, None)}
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
    with ExitStack() as stack:
        arms = open_arms(stack, args, systems, flags)
        for engine in arms.values():
            engine.run_batch(prompts[:2], render, sampling(0.0, 8))  # warm-up
        names = list(arms)
        rates: dict[str, list[float]] = {a: [] for a in names}
        taus: dict[str, float | None] = {}
        for r in range(args.rounds):
            for a in names[r % len(names):] + names[:r % len(names)]:
                result = arms[a].run_batch(prompts, render, sampling(0.0, args.tokens, ignore_eos=False),
                                           concurrency=args.concurrency)
                rates[a].append(result.output_tokens / result.wall_s)
                taus[a] = result.counters.tau if result.counters.num_drafts else None
            print(f"round {r + 1}: " + "; ".join(f"{a} {rates[a][-1] / rates['AR'][-1]:.3f}" for a in names),
                  flush=True)
    for a in names:
        ratios = [x / y for x, y in zip(rates[a], rates["AR"])]
        print(f"{a:28s} median {statistics.median(ratios):.3f} mean {statistics.mean(ratios):.3f} "
              f"range {min(ratios):.3f}-{max(ratios):.3f} tau {taus[a] and round(taus[a], 2)}")


if __name__ == "__main__":
    main()
