"""Are the served lattice drafts exactly the unoptimised path's? Checked on every draft step of
real prompts through a real engine (issue 19's "drafts identical on the benchmark prompts").

    source scripts/env.sh
    python -m tools.draft_identity --target .cache/targets/smollm2-135m-instruct \
        --systems testbed/smollm2/systems.json --var drafts=$PWD/testbed/smollm2/round3/drafts \
        --only LiLiCorr-greedy,LiLiCorr-viterbi,LiLiCorr+DeLS --benchmarks pypi \
        --data-dir .cache/benchmarks --limit 2 --max-tokens 64

For each system (a lattice rule), one in-process engine generates greedily for the first
--limit prompts of each benchmark (their first user turn, the chat template). Every call of
the rule's `propose` also runs a twin built on the same head with `reference=True` (the path as
first written: `LatticeHead.score`, `topk_candidates_reference`, `walk_faults_reference`) on the
same inputs; the served block is the fast one. Printed per system: draft steps, rows, rows whose
drafted tokens differ (must be 0) and rows whose fault flags differ. Exit 1 if any differ.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Sequence

import torch

from eval.benchmarks import expand_names, load_benchmark
from eval.prompts import PromptRenderer
from eval.systems import load_systems


def _reference_twin(rule):
    twin = copy.copy(rule)
    twin.reference, twin.scorer = True, None
    return twin


def check_system(target: str, system, prompts: list[list[int]], max_tokens: int) -> dict[str, int]:
    from vllm import SamplingParams

    from vllm_liliprop.vllm.offline import OfflineEngine

    flags = {"dtype": "bfloat16", "max_model_len": 2048, "enforce_eager": True}
    counts = {"steps": 0, "rows": 0, "token_mismatch_rows": 0, "fault_mismatch_rows": 0}
    with OfflineEngine(target, flags, system.speculative_config, system.options(), 1) as engine:
        runner = engine.llm.llm_engine.model_executor.driver_worker.worker.model_runner
        rule = runner.drafter.draft_rule
        if not hasattr(rule, "reference"):
            raise ValueError(f"{system.name}: rule {rule.name!r} has no reference path to compare against")
        twin = _reference_twin(rule)
        propose = rule.propose

        def checked(inputs):
            served = propose(inputs)
            expected = twin.propose(inputs)
            counts["steps"] += 1
            counts["rows"] += int(served.token_ids.shape[0])
            counts["token_mismatch_rows"] += int((served.token_ids != expected.token_ids).any(-1).sum())
            if served.faulty_rows is not None or expected.faulty_rows is not None:
                mine = torch.zeros_like(served.token_ids[:, 0], dtype=torch.bool) if served.faulty_rows is None else served.faulty_rows
                theirs = torch.zeros_like(mine) if expected.faulty_rows is None else expected.faulty_rows
                counts["fault_mismatch_rows"] += int((mine != theirs).sum())
            return served

        rule.propose = checked
        params = SamplingParams(temperature=0, max_tokens=max_tokens)
        engine.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser(prog="python -m tools.draft_identity", description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--systems", required=True)
    parser.add_argument("--var", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--only", required=True, help="lattice systems, comma-separated")
    parser.add_argument("--benchmarks", required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--limit", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    render = PromptRenderer(AutoTokenizer.from_pretrained(args.target))
    prompts = []
    for name in expand_names(args.benchmarks.split(","), args.data_dir):
        for example in load_benchmark(name, data_dir=args.data_dir, limit=args.limit):
            prompts.append(render([{"role": "user", "content": example.turns[0]}]))
    variables = dict(v.split("=", 1) for v in args.var)
    catalog = load_systems(args.systems, variables)
    failed = False
    for name in args.only.split(","):
        system, _ = catalog.get(name)
        counts = check_system(args.target, system, prompts, args.max_tokens)
        failed |= counts["token_mismatch_rows"] > 0 or counts["fault_mismatch_rows"] > 0
        print(json.dumps({"system": name, "prompts": len(prompts), **counts}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
