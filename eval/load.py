"""`python -m eval.load`: many mixed requests at high concurrency through a small KV cache.

A benchmark of reliability, not of speed: N requests (default 512) cycle through the benchmarks'
prompts with mixed temperatures, max_tokens and stop strings, at concurrency c (default 32),
with the KV cache cut to a few blocks so that vLLM preempts requests. One speculative system and
plain decoding run the same requests with the same seeds and engine flags, one after the other.
What must hold: every request finishes (stop or length), a stop string never appears in the text
it ended, greedy requests give token for token plain decoding's output, and the draft rule
counted no fault. The wall times of the two engines are printed side by side (a ratio measured
in one run), with the preemptions vLLM counted. The result is one tidy row per engine (CSV).

    python -m eval.load --target .cache/targets/smollm2-135m-instruct \
        --systems testbed/smollm2/systems.json --var drafts=$PWD/testbed/smollm2/round3/drafts \
        --system-name LiLiCorr-greedy --benchmarks pypi --data-dir .cache/benchmarks \
        --out results/load.csv
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from transformers import AutoTokenizer

from eval.benchmarks import expand_names, load_benchmark
from eval.prompts import PromptRenderer
from eval.systems import load_systems, parse_vars
from vllm_liliprop.vllm.metrics import SpecDecodeCounters
from vllm_liliprop.vllm.offline import OfflineEngine, vllm_version

TEMPERATURES = (0.0, 0.0, 0.7, 1.0)  # half greedy: those are checked token for token
MAX_TOKENS = (16, 32, 64, 96)
STOPS = (None, ["\n\n"], None, [".", "!"])


@dataclass(frozen=True)
class LoadRequest:
    index: int
    prompt_ids: tuple[int, ...]
    temperature: float
    max_tokens: int
    stop: tuple[str, ...] | None
    seed: int


def mixed_requests(prompts: list[list[int]], count: int, seed: int = 0) -> list[LoadRequest]:
    """`count` requests cycling through `prompts`, each with its own temperature, max_tokens,
    stop strings and seed, drawn independently (so every combination occurs)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        stop = rng.choice(STOPS)
        out.append(LoadRequest(i, tuple(prompts[i % len(prompts)]), rng.choice(TEMPERATURES),
                               rng.choice(MAX_TOKENS), None if stop is None else tuple(stop),
                               seed * 100_003 + i))
    return out


@dataclass
class EngineRun:
    token_ids: list[list[int]]
    texts: list[str]
    finish_reasons: list[str | None]
    wall_s: float
    preemptions: int
    counters: SpecDecodeCounters
    rule_faults: int | None  # None: not readable (multiprocess engine, or no rule)


def run_requests(target: str, engine_flags: dict, requests: list[LoadRequest], concurrency: int,
                 speculative_config: dict | None = None, liliprop_options: dict | None = None
                 ) -> EngineRun:
    from vllm import SamplingParams

    params = [SamplingParams(temperature=r.temperature, max_tokens=r.max_tokens,
                             stop=list(r.stop) if r.stop else None, seed=r.seed)
              for r in requests]
    prompts = [{"prompt_token_ids": list(r.prompt_ids)} for r in requests]
    with OfflineEngine(target, engine_flags, speculative_config, liliprop_options,
                       max_num_seqs=concurrency) as engine:
        start = time.perf_counter()
        outputs = engine.llm.generate(prompts, params, use_tqdm=True)
        wall_s = time.perf_counter() - start
        metrics = {m.name: m.value for m in engine.llm.get_metrics() if hasattr(m, "value")}
        # The rule's fallback rows from vLLM's metrics (vllm_liliprop/vllm/rule_health.py), which
        # a multiprocess engine reports too; None when no rule drafted.
        ruled = "vllm:liliprop_rule_draft_rows" in metrics
        faults = int(metrics.get("vllm:liliprop_rule_fallback_rows", 0)) if ruled else None
        counters = engine.counters()
    return EngineRun([list(o.outputs[0].token_ids) for o in outputs],
                     [o.outputs[0].text for o in outputs],
                     [o.outputs[0].finish_reason for o in outputs], wall_s,
                     int(metrics.get("vllm:num_preemptions", 0)), counters, faults)


def check(requests: list[LoadRequest], run: EngineRun, plain: EngineRun | None) -> dict:
    """The figures that must hold for one engine's run (see the module docstring)."""
    greedy = [r.index for r in requests if r.temperature == 0]
    stopped = [r for r in requests if r.stop and run.finish_reasons[r.index] == "stop"]
    return {
        "completed": sum(reason in ("stop", "length") for reason in run.finish_reasons),
        "stop_string_leaks": sum(any(s in run.texts[r.index] for s in r.stop) for r in stopped),
        "greedy_requests": len(greedy),
        "greedy_identical": (None if plain is None else
                             sum(run.token_ids[i] == plain.token_ids[i] for i in greedy)),
    }


def load_prompts(target: str, benchmarks: list[str], data_dir: str | None,
                 max_prompt_tokens: int) -> list[list[int]]:
    """Every benchmark's first user turns, rendered with the target's chat template, interleaved
    (one of each benchmark in turn) so that any prefix of the request list mixes them."""
    render = PromptRenderer(AutoTokenizer.from_pretrained(target), max_prompt_tokens=max_prompt_tokens)
    per_benchmark = [[render([{"role": "user", "content": e.turns[0]}])
                      for e in load_benchmark(name, "local", data_dir)]
                     for name in expand_names(benchmarks, data_dir)]
    width = max(len(p) for p in per_benchmark)
    return [p[i] for i in range(width) for p in per_benchmark if i < len(p)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--systems", required=True, metavar="FILE", help="systems file (eval/systems.py)")
    parser.add_argument("--var", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--system-name", required=True, help="the speculative system to load")
    parser.add_argument("--benchmarks", default="pypi", help="benchmarks or groups whose prompts cycle")
    parser.add_argument("--data-dir")
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--kv-blocks", type=int, default=64,
                        help="KV cache blocks (num_gpu_blocks_override): small, so vLLM preempts")
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--max-prompt-tokens", type=int, default=512)
    parser.add_argument("--dtype", default="float32",
                        help="float32: greedy output can be compared token for token (eval/README.md)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="CSV to write (one row per engine)")
    args = parser.parse_args(argv)

    system, _ = load_systems(args.systems, parse_vars(args.var)).get(args.system_name)
    if system.speculative_config is None:
        parser.error(f"--system-name {args.system_name!r} does not speculate; name a speculative system")
    benchmarks = [name.strip() for name in args.benchmarks.split(",") if name.strip()]
    prompts = load_prompts(args.target, benchmarks, args.data_dir, args.max_prompt_tokens)
    requests = mixed_requests(prompts, args.requests, args.seed)
    flags = {"dtype": args.dtype, "enforce_eager": True, "block_size": args.block_size,
             "num_gpu_blocks_override": args.kv_blocks,
             "max_model_len": min(args.kv_blocks * args.block_size, args.max_prompt_tokens + max(MAX_TOKENS))}
    plain = run_requests(args.target, flags, requests, args.concurrency)
    spec = run_requests(args.target, flags, requests, args.concurrency,
                        system.speculative_config, system.options())
    rows = []
    for name, run, reference in (("AR", plain, None), (system.name, spec, plain)):
        rows.append({
            "system": name, "requests": len(requests), "concurrency": args.concurrency,
            "kv_blocks": args.kv_blocks, "block_size": args.block_size, "dtype": args.dtype,
            "wall_s": round(run.wall_s, 2), "output_tokens": sum(map(len, run.token_ids)),
            "tokens_per_s": round(sum(map(len, run.token_ids)) / run.wall_s, 1),
            "preemptions": run.preemptions, "num_drafts": run.counters.num_drafts,
            "tau": round(run.counters.tau, 3),
            "rule_faults": run.rule_faults, **check(requests, run, reference),
            "system_config": system.config_json() if reference is not None else "{}",
            "request_mix": json.dumps({"temperatures": TEMPERATURES, "max_tokens": MAX_TOKENS,
                                       "stops": STOPS, "seed": args.seed}),
            "target": args.target, "benchmarks": args.benchmarks, "vllm_version": vllm_version(),
        })
    table = pd.DataFrame(rows)
    print(table.drop(columns=["system_config", "request_mix", "target", "vllm_version"]).to_string(index=False))
    print(f"wall time {system.name} / AR: {spec.wall_s / plain.wall_s:.2f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out, index=False)
    failed = [k for k, ok in (("completed", rows[1]["completed"] == len(requests)),
                              ("stop strings", rows[1]["stop_string_leaks"] == 0),
                              ("greedy identity", rows[1]["greedy_identical"] == rows[1]["greedy_requests"]),
                              ("no faults", not rows[1]["rule_faults"])) if not ok]
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
