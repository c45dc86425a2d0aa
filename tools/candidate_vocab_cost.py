"""What a LiLiCorr draft's candidate vocabulary saves a step: one engine, the two lattices interleaved.

    source scripts/env.sh
    python -m tools.candidate_vocab_cost --rounds 8      # LiLiCorr-greedy, batch 1, its served k

One in-process engine serves the system's LiLiCorr draft (which must have candidate_vocab/,
vllm_liliprop/heads/candidate_vocab.py). Each round runs the same held-out prompt twice: once
with the lattice over the candidate vocabulary (the draft as shipped), once over the full
vocabulary (the rule's vocab_ids and the proposer's row logits switched off, which is what the
draft serves without the folder). The order alternates by round. Printed: ms per step of the
stage rows (vllm_liliprop/vllm/offline.py: StageTimes) for each arm, median over rounds, and the
step wall's ratio (candidate vocabulary / full) with a 95% bootstrap interval over rounds. The
drafts differ only where a candidate falls outside the vocabulary, so the steps are comparable.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics

import numpy as np

from eval.schedule import HELDOUT, heldout_prompts, pinned, renderer, sampling
from eval.systems import load_systems
from tools.stage_profile import FLAGS, TARGET
from vllm_liliprop.vllm.offline import STEP_WALL, OfflineEngine, in_process_drafter


@contextlib.contextmanager
def full_vocabulary(drafter):
    """The lattice over every id for the duration: what the draft serves without the folder."""
    saved = drafter.draft_rule.vocab_ids, drafter._draft_vocab_logits
    drafter.draft_rule.vocab_ids, drafter._draft_vocab_logits = None, None
    try:
        yield
    finally:
        drafter.draft_rule.vocab_ids, drafter._draft_vocab_logits = saved


def ratio_interval(a: list[float], b: list[float], draws: int = 2000) -> tuple[float, float, float]:
    """Median of a/b per round and a 95% percentile bootstrap interval over rounds."""
    ratios = np.asarray(a) / np.asarray(b)
    rng = np.random.default_rng(0)
    medians = np.median(rng.choice(ratios, (draws, ratios.size)), axis=1)
    return float(np.median(ratios)), float(np.quantile(medians, 0.025)), float(np.quantile(medians, 0.975))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--system", default="LiLiCorr-greedy")
    parser.add_argument("--drafts", default="testbed/smollm2/round3/drafts")
    parser.add_argument("--k", type=int, default=None, help="pin k at batch 1 (default: the system's)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args(argv)
    system, _ = load_systems("testbed/smollm2/systems.json", {"drafts": args.drafts}).get(args.system)
    config = system.speculative_config
    if args.k is not None:
        config = pinned(config, args.k, 1)
    render, prompts = renderer(TARGET), heldout_prompts(HELDOUT, 2)
    arms: dict[str, list[dict]] = {"candidate vocabulary": [], "full vocabulary": []}
    with OfflineEngine(TARGET, FLAGS, config, system.options(), max_num_seqs=1) as engine:
        drafter = in_process_drafter(engine.llm)
        if getattr(drafter.draft_rule, "vocab_ids", None) is None:
            parser.error(f"{args.system}'s draft in {args.drafts} has no candidate_vocab/")
        engine.run_batch(prompts[:1], render, sampling(0.0, 16))
        for round_ in range(args.rounds):
            order = list(arms) if round_ % 2 == 0 else list(arms)[::-1]
            for arm in order:
                scope = full_vocabulary(drafter) if arm == "full vocabulary" else contextlib.nullcontext()
                with scope, engine.stage_timer() as times:
                    engine.run_batch(prompts[1:2], render, sampling(0.0, args.tokens))
                arms[arm].append(times.per_step_ms())
    stages = list(arms["full vocabulary"][0])
    print(f"{args.system}, batch 1, {args.rounds} rounds of {args.tokens} tokens; ms per step, median over rounds")
    print(f"| stage | {' | '.join(arms)} |\n|---|---|---|")
    for stage in stages:
        print(f"| {stage} | " + " | ".join(f"{statistics.median(r[stage] for r in rows):.2f}"
                                           for rows in arms.values()) + " |")
    walls = {arm: [r[STEP_WALL] for r in rows] for arm, rows in arms.items()}
    mid, low, high = ratio_interval(walls["candidate vocabulary"], walls["full vocabulary"])
    print(f"step wall, candidate vocabulary / full: {mid:.3f} [{low:.3f}, {high:.3f}]")


if __name__ == "__main__":
    main()
