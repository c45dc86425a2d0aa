"""`python -m eval schedule`: measure this host and write each system's speculation schedule.

For each chosen system (its `num_speculative_tokens` = K):
- step costs: a plain engine and one engine per system, all open at once in this process; the
  system's engine drafts each k in 0..K in turn (vLLM's batch-size -> k table pinned to k,
  OfflineEngine.pin_k). At each batch size b, b held-out prompts generate a short and a long
  greedy run (ignore_eos) and the extra wall time over the extra engine steps is the cost of
  one decoding step (the prefill cancels). Every arm is timed once per round, rounds
  interleaved (`--rounds`, median used), so the host's drift between arms cancels: timed one
  engine after another, this 2-core host once ranked k = 1 dearer than k = 3;
- acceptance per position: the k = K engine on held-out prompts (T = 0, natural ends);
- served batches (`--served-batch-sizes`, default 4,16,32): every arm serves other held-out
  prompts through b slots to their natural ends as `eval run` serves concurrency b: max(b, 16)
  prompts (`--served-prompts`), so a batch of 4 refills its slots as eval's c = 4 over 16 prompts
  does and a batch of 32 starts full and drains. Its tokens/s over plain decoding's in the same
  round is set against the steady-state model's. (A lone drained batch of 4 had run DFlash at
  1.02x where eval's refilled c = 4 ran it at 1.10-1.20x.) At batch 16-32 on SmolLM2 the model
  had predicted drafting level with plain decoding where served benchmark batches ran
  0.80-0.87x: the steps don't see the prefill's drafter context or a batch that drains
  unevenly. The ratio (served over predicted) calibrates each k's rate;
- the schedule maximising expected tokens/s (eval/schedule_model.py) for batch sizes 1..max.
It writes a systems file (eval/systems.py) with AR, each system as it was (fixed k) and
`<name>-scheduled` (the schedule in its speculative_config), which `python -m eval run` serves,
and beside it `<out>.measurements.json`: the costs, acceptance, served rates and predicted
tokens/s.

With `--temperature T > 0` every timed and accepted run samples at T (seeded), and the plan is
for sampled requests: `<name>+sampled-k` is the system as given (its own k-by-batch table, the
greedy requests', kept) with the plan as `liliprop.sampled_k` (vllm_liliprop/sampled_drafts.py).
vLLM's table is one k per batch size for every request; a sampled draft pays less and its
verification costs more, so its k is planned on its own.
Prompts come from a held-out file of the drafts' build, never from the benchmarks.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from contextlib import ExitStack
from itertools import cycle, islice
from pathlib import Path

from tqdm import tqdm

from eval import schedule_model
from eval.prompts import PromptRenderer
from eval.systems import BASELINE, SCHEDULED, load_systems, parse_vars, select_systems
from training.data import read_jsonl_conversations
from vllm_liliprop.host import fast_dtype

HELDOUT = "testbed/smollm2/data/heldout_regenerated.jsonl.gz"
SAMPLED = "+sampled-k"
SEED = 42  # of the sampled runs (--temperature > 0)


def add_parser(sub) -> None:
    p = sub.add_parser("schedule", help="measure step costs and acceptance on this host; write "
                       "each system's k-by-batch-size schedule into a systems file")
    p.add_argument("--target", required=True)
    p.add_argument("--systems", required=True, metavar="FILE")
    p.add_argument("--var", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--only", required=True, metavar="A,B", help="speculative systems to schedule")
    p.add_argument("--heldout", default=HELDOUT, help="conversations JSONL(.gz) the drafts were "
                   "not trained on (never benchmark prompts)")
    p.add_argument("--prompts", type=int, default=8, help="held-out prompts for acceptance")
    p.add_argument("--batch-sizes", default="1,4,16,32", metavar="B,B")
    p.add_argument("--max-batch", type=int, help="schedule up to this batch size (default: the "
                   "largest of --batch-sizes)")
    p.add_argument("--tokens", default="8,40", metavar="SHORT,LONG",
                   help="generation lengths of the two timed runs per batch size")
    p.add_argument("--engine-flags", default="{}", metavar="JSON",
                   help="vllm.LLM keyword arguments (dtype default: this host's, "
                        "python -m vllm_liliprop.host)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (the median is used)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="time and accept at this temperature; > 0 plans the k of sampled requests "
                        "(written as liliprop.sampled_k of <name>+sampled-k)")
    p.add_argument("--margin", type=float, default=0.05, help="draft (k > 0) at a batch size only "
                   "where the model predicts more than this fraction over a plain step (default 0.05)")
    p.add_argument("--served-batch-sizes", default="4,16,32", metavar="B,B",
                   help="also serve held-out prompts (the ones after --prompts) through this many "
                        "slots as eval serves that concurrency (see --served-prompts), every k and "
                        "plain decoding, and scale the model's rates by served over predicted "
                        "(eval/schedule_model.py); '' turns it off. With --from-measurements, sizes "
                        "the file lacks are measured now")
    p.add_argument("--served-prompts", type=int, default=16, metavar="N",
                   help="a served batch of b runs max(b, N) held-out prompts through b slots, "
                        "refilled as requests end (eval's c = 4 over 16 prompts), or started full "
                        "and drained where b >= N")
    p.add_argument("--served-tokens", type=int, default=48, help="max tokens of each served request")
    p.add_argument("--sampled-k0", action="store_true",
                   help="the greedy plan's <name>-scheduled also never drafts for sampled requests "
                        "(liliprop.sampled_k 0 at every batch size): on this 2-core host a sampled "
                        "draft's verification cost more than it gained at c = 1-16 (eval/README.md)")
    p.add_argument("--from-measurements", metavar="FILE", help="plan from a measurements file an earlier "
                   "run wrote (<out>.measurements.json) instead of timing this host again")
    p.add_argument("--out", required=True, help="systems file to write")


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{flag} {text!r} must be integers separated by commas") from None
    if not values or min(values) < 1:
        raise ValueError(f"{flag} {text!r} needs one or more integers >= 1")
    return values


def heldout_prompts(path: str, count: int) -> list[list[str]]:
    """The first user turn of the first `count` held-out conversations."""
    firsts = [next(m["content"] for m in conv["messages"] if m["role"] == "user")
              for conv in islice(read_jsonl_conversations(path), count)]
    if not firsts:
        raise ValueError(f"--heldout {path} has no conversations")
    return [[text] for text in firsts]


def engine_flags(text: str) -> dict:
    flags = json.loads(text)
    if not isinstance(flags, dict):
        raise ValueError("--engine-flags must be a JSON object of vllm.LLM keyword arguments")
    if "dtype" not in flags:
        flags["dtype"] = fast_dtype()
    return flags


def pinned(speculative_config: dict, k: int, max_batch: int) -> dict:
    """The system's config with every batch size drafting exactly k."""
    return dict(speculative_config, num_speculative_tokens_per_batch_size=[[1, max_batch, k]])


def sampling(temperature: float, max_tokens: int, ignore_eos: bool = True):
    """The Sampling of every schedule run: greedy, or seeded at temperature > 0."""
    from vllm_liliprop.vllm.offline import Sampling

    return Sampling(temperature, max_tokens, SEED if temperature > 0 else None, ignore_eos)


def _one_step_cost(engine, batch, render, tokens, temperature: float = 0.0) -> float:
    """Seconds per decoding step: the long run's extra time over its extra steps, so that the
    prefill and the engine's per-batch overheads cancel."""
    short, long = (engine.run_batch(batch, render, sampling(temperature, n)) for n in tokens)
    extra_steps = long.num_steps - short.num_steps
    if extra_steps <= 0:
        raise ValueError(f"--tokens {tokens}: the long run took no more steps than the short "
                         "one; make LONG larger")
    return (long.wall_s - short.wall_s) / extra_steps


def acceptance(engine, prompts, render, max_tokens=64, temperature: float = 0.0) -> list[float]:
    """Fraction of drafts accepted through each position (the prompts' natural answers)."""
    result = engine.run_batch(prompts, render, sampling(temperature, max_tokens, ignore_eos=False))
    if result.counters.num_drafts == 0:
        raise ValueError("the system drafted nothing on the held-out prompts")
    return list(result.counters.acceptance_rate_per_pos)


def verified_top(speculative_config: dict, liliprop: dict | None) -> int:
    """The largest k worth scheduling: the configured k, or `rule_draft_length` where that cuts
    every draft (no prompt lookup, whose rows keep all k). Served at k = 7 with 3 verified, a
    scheduled k of 4..7 verifies the same 3 tokens as k = 3, at the same cost: the proposer
    queries the drafter's whole block at every k (draft_length.queried_masks)."""
    top = int(speculative_config["num_speculative_tokens"])
    options = liliprop or {}
    length = options.get("rule_draft_length")
    if length is None or options.get("prompt_lookup") is not None:
        return top
    return min(top, int(length))


def arms(systems) -> list[tuple[str, int]]:
    """(engine name, k) of every timed arm: plain decoding, then each system at k = K..0, K its
    verified_top."""
    top = {s.name: verified_top(s.speculative_config, s.liliprop) for s in systems}
    return [(BASELINE, 0)] + [(name, k) for name, K in top.items() for k in range(K, -1, -1)]


def interleaved(engines, arm_list, batches: dict[int, list], measure, rounds: int, log, unit: str) -> dict:
    """measure(engine, batch) of every arm at every batch size, in `rounds` interleaved rounds
    (each round measures every arm once per batch size, in an order rotated from round to round),
    so a shared host's drift falls on all arms alike: {name: {k: {b: [value, one per round]}}}.
    A system's engine runs each k in turn (OfflineEngine.pin_k); k None leaves its engine's own
    schedule in place."""
    values: dict = {}
    bar = tqdm(total=rounds * len(batches) * len(arm_list), desc=unit, dynamic_ncols=True)
    for r in range(rounds):
        for b, batch in batches.items():
            shift = (r + b) % len(arm_list)
            for name, k in arm_list[shift:] + arm_list[:shift]:
                if name != BASELINE and k is not None:
                    engines[name].pin_k(k)
                values.setdefault(name, {}).setdefault(k, {}).setdefault(b, []).append(
                    measure(engines[name], batch))
                bar.update()
        log(f"{unit}, round {r + 1}/{rounds}: " + "; ".join(
            f"{name} k={k} " + ", ".join(f"b={b} {v[-1]:.4g}" for b, v in by_b.items())
            for name, by_k in values.items() for k, by_b in by_k.items()))
    bar.close()
    return values


def warm_up(engines, prompts, render, temperature: float, tokens: int) -> None:
    """One short untimed run on every engine, so no arm's first timed run pays its cold start."""
    for engine in engines.values():
        engine.run_batch(prompts[:1], render, sampling(temperature, tokens))


def step_costs(engines, arm_list, prompts, render, batch_sizes, tokens, rounds, log,
               temperature: float = 0.0) -> dict:
    """Seconds per steady-state step of every arm at every batch size (interleaved), the batch
    cycling through the acceptance prompts."""
    warm_up(engines, prompts, render, temperature, tokens[0])
    batches = {b: list(islice(cycle(prompts), b)) for b in batch_sizes}
    return interleaved(engines, arm_list, batches,
                       lambda engine, batch: _one_step_cost(engine, batch, render, tokens, temperature),
                       rounds, log, "seconds per step")


def served_counts(batch_sizes, served_prompts: int) -> dict[int, int]:
    """How many held-out prompts a served batch of b runs through its b slots: `served_prompts`,
    or b where b is larger (then the batch starts full and drains, as eval's c = 32 over a
    benchmark of 32 prompts; below it the slots refill, as eval's c = 4 over 16 prompts)."""
    return {b: max(b, served_prompts) for b in batch_sizes}


def served_rates(engines, arm_list, prompts, render, counts: dict[int, int], max_tokens, rounds, log,
                 temperature: float = 0.0) -> dict:
    """Tokens/s of every arm serving as eval does (at each batch size b, counts[b] held-out
    prompts through b slots, refilled as requests end; natural ends, `max_tokens` each; prefill
    and the final drain included), interleaved."""
    if max(counts.values()) > len(prompts):
        raise ValueError(f"served batches need {max(counts.values())} held-out prompts after the "
                         f"--prompts ones, {len(prompts)} are left: pass smaller --served-batch-sizes "
                         f"or --served-prompts, or a larger --heldout")

    def rate(engine, slots_and_prompts) -> float:
        slots, batch = slots_and_prompts
        result = engine.run_batch(batch, render, sampling(temperature, max_tokens, ignore_eos=False),
                                  concurrency=slots)
        return result.output_tokens / result.wall_s

    batches = {b: (b, prompts[:count]) for b, count in counts.items()}
    return interleaved(engines, arm_list, batches, rate, rounds, log, "served tokens/s")


def medians(times: dict[int, dict[int, list[float]]]) -> dict[int, dict[int, float]]:
    return {k: {b: statistics.median(t) for b, t in by_b.items()} for k, by_b in times.items()}


def plain_step_costs(times: dict) -> dict[int, float]:
    """{batch: seconds} of a plain step: the median over plain decoding's rounds and every
    system's k = 0 rounds. A k = 0 step is a plain step (<1% apart when timed side by side,
    docs/measurements-smollm2.md, "What a k = 0 engine costs"), so each engine's k = 0 arm is
    one more sample of one cost; one engine's single round had put it 29% over plain decoding's
    (LiLiCorr+lookup at batch 32, the AMX host's plan of 2026-12-07), and the plan then drafted
    where drafting was predicted below plain decoding."""
    samples: dict[int, list[float]] = {}
    for by_k in times.values():
        for b, values in by_k.get(0, {}).items():
            samples.setdefault(b, []).extend(values)
    return {b: statistics.median(values) for b, values in samples.items()}


def ratios_to_plain(values: dict, plain: dict[int, list[float]]) -> dict[int, dict[int, float]]:
    """Each k's value over plain decoding's in the same round, the median over rounds: the paired
    figure (a k = 0 step's cost against a plain engine's, a served batch's tokens/s against
    plain decoding's)."""
    return {k: {b: round(statistics.median(x / y for x, y in zip(v, plain[b])), 4)
                for b, v in by_b.items()} for k, by_b in values.items()}


def predicted_over_plain(accepted, costs, ar_costs, batch_sizes) -> dict[int, dict[int, float]]:
    """The steady-state model's tokens/s of each k over plain decoding's, at each batch size."""
    return {k: {b: round(schedule_model.tokens_per_s(accepted, costs, b, k)
                         / (b / schedule_model.interpolated(ar_costs, b)), 4) for b in batch_sizes}
            for k in costs}


def predictions(accepted, costs, ar_costs, ranges, batch_sizes, factors=None) -> list[dict]:
    """Expected tokens/s at each measured batch size: plain decoding, fixed K, the schedule
    (calibrated by served factors where given)."""
    top = max(costs)
    rows = []
    for b in batch_sizes:
        k = schedule_model.k_at(ranges, b)
        rows.append({"batch": b, "k": k,
                     "AR": b / schedule_model.interpolated(ar_costs, b),
                     "fixed": schedule_model.tokens_per_s(accepted, costs, b, top, factors),
                     "scheduled": schedule_model.tokens_per_s(accepted, costs, b, k, factors)})
    return rows


# liliprop.sampled_k of --sampled-k0: no draft for a sampled request at any batch size vLLM allows.
SAMPLED_NEVER = [[1, 1024, 0]]


def scheduled_entry(entry: dict, ranges: list[list[int]], summary: str, sampled_k0: bool = False) -> dict:
    spec = dict(entry["speculative_config"], num_speculative_tokens_per_batch_size=ranges)
    scheduled = dict(entry, speculative_config=spec,
                     description=f"{entry.get('description', '')} | scheduled on this host: {summary}")
    if sampled_k0:
        scheduled.update(liliprop={**(entry.get("liliprop") or {}), "sampled_k": SAMPLED_NEVER},
                         description=scheduled["description"] + " | sampled requests never draft")
    return scheduled


def sampled_entry(entry: dict, ranges: list[list[int]], summary: str, _sampled_k0: bool = False) -> dict:
    """The system with the plan as its sampled requests' schedule (liliprop.sampled_k); the
    ranges at the system's full k cut nothing and are left out (none left: no sampled_k)."""
    top = verified_top(entry["speculative_config"], entry.get("liliprop"))
    cuts = [r for r in ranges if r[2] < top]
    options = {**(entry.get("liliprop") or {}), **({"sampled_k": cuts} if cuts else {})}
    return dict(entry, **({"liliprop": options} if options else {}),
                description=f"{entry.get('description', '')} | sampled requests scheduled on this "
                            f"host: {summary}")


# How a plan is written, by whether it was timed at T > 0: (name suffix, entry builder).
PLAN_ENTRIES = {False: (SCHEDULED, scheduled_entry), True: (SAMPLED, sampled_entry)}


def open_engines(stack: ExitStack, args, systems, flags, seqs: int) -> dict:
    """Plain decoding's engine and one engine per system (at its K), open together in `stack`."""
    from vllm_liliprop.vllm.offline import OfflineEngine

    engines = {BASELINE: stack.enter_context(OfflineEngine(args.target, flags, None, None, max_num_seqs=seqs))}
    for system in systems:
        top = int(system.speculative_config["num_speculative_tokens"])
        engines[system.name] = stack.enter_context(OfflineEngine(
            args.target, flags, pinned(system.speculative_config, top, seqs), system.options(),
            max_num_seqs=seqs))
    return engines


def renderer(target: str) -> PromptRenderer:
    from transformers import AutoTokenizer

    return PromptRenderer(AutoTokenizer.from_pretrained(target))


def measure_all(args, systems, flags, prompts, served_prompts, batch_sizes, counts, tokens,
                max_batch, log) -> tuple[dict, dict, dict]:
    """(acceptance per position of each system at its K, step_costs' times of every arm,
    served_rates' tokens/s of every arm at the served counts, or {} without them), with every
    engine open together."""
    render = renderer(args.target)
    with ExitStack() as stack:
        engines = open_engines(stack, args, systems, flags, max([max_batch, *counts]))
        accepted = {s.name: acceptance(engines[s.name], prompts, render, temperature=args.temperature)
                    for s in systems}
        times = step_costs(engines, arms(systems), prompts, render, batch_sizes, tokens, args.rounds, log,
                           args.temperature)
        served = served_rates(engines, arms(systems), served_prompts, render, counts,
                              args.served_tokens, args.rounds, log, args.temperature) if counts else {}
    return accepted, times, served


def measure_served(args, systems, flags, served_prompts, counts, log) -> dict:
    """served_rates alone, for the served batch sizes an earlier measurements file lacks."""
    render = renderer(args.target)
    with ExitStack() as stack:
        engines = open_engines(stack, args, systems, flags, max(counts))
        warm_up(engines, served_prompts, render, args.temperature, 4)
        return served_rates(engines, arms(systems), served_prompts, render, counts, args.served_tokens,
                            args.rounds, log, args.temperature)


def measured_before(record: dict, path: str, systems, batch_sizes, served_sizes) -> tuple[dict, dict, dict]:
    """measure_all's result as an earlier run of this command recorded it (`record`, read from
    its measurements file `path`), to plan again (another --max-batch, a changed cost model,
    some of its served sizes) without timing anything; served sizes it lacks are left out
    (`command` measures them)."""
    missing = [s.name for s in systems if s.name not in record["systems"]]
    if missing or record["batch_sizes"] != batch_sizes:
        raise ValueError(f"--from-measurements {path} holds systems {sorted(record['systems'])} at "
                         f"batch sizes {record['batch_sizes']}: pass those to --only and --batch-sizes")

    def by_k(values: dict) -> dict:
        return {int(k): {int(b): v for b, v in by_b.items()} for k, by_b in values.items()}

    def arms_of(plain_key: str, system_key: str) -> dict:
        if plain_key not in record:
            return {}
        values = {BASELINE: by_k({0: record[plain_key]})}
        values.update({s.name: by_k(record["systems"][s.name][system_key]) for s in systems})
        return values

    times = arms_of("AR_step_costs_s_by_round", "step_costs_s_by_round")
    served = arms_of("AR_served_tokens_per_s_by_round", "served_tokens_per_s_by_round")
    served = {name: {k: {b: v for b, v in by_b.items() if b in served_sizes} for k, by_b in arm.items()}
              for name, arm in served.items()} if served_sizes else {}
    return {s.name: record["systems"][s.name]["acceptance_per_pos"] for s in systems}, times, served


def merge_served(served: dict, more: dict) -> None:
    """Adds `more` (served_rates' tokens/s at other batch sizes) into `served`, arm by arm."""
    for name, by_k in more.items():
        for k, by_b in by_k.items():
            served.setdefault(name, {}).setdefault(k, {}).update(by_b)


def served_calibration(accepted, costs, ar_costs, served: dict, name: str) -> dict:
    """The record's served fields of one system ({} without served measurements): served and
    predicted tokens/s over plain decoding's per k and served batch size, and their ratio, the
    factors that calibrate the plan (schedule_model.served_factors)."""
    if not served:
        return {}
    served_over = ratios_to_plain(served[name], served[BASELINE][0])
    sizes = sorted(served[BASELINE][0])
    predicted = predicted_over_plain(accepted, costs, ar_costs, sizes)
    return {"served_tokens_per_s_by_round": served[name], "served_over_plain": served_over,
            "predicted_over_plain": predicted,
            "served_factors": schedule_model.served_factors(served_over, predicted)}


def command(args) -> int:
    variables = parse_vars(args.var)
    names = [n for n in args.only.split(",") if n]
    systems = select_systems(load_systems(args.systems, variables), names)
    if any(s.speculative_config is None for s in systems):
        raise ValueError("--only names a system without speculative_config: nothing to schedule")
    batch_sizes = sorted(set(_ints(args.batch_sizes, "--batch-sizes")))
    tokens = _ints(args.tokens, "--tokens")
    if len(tokens) != 2 or tokens[0] >= tokens[1]:
        raise ValueError(f"--tokens {args.tokens!r} must be SHORT,LONG with SHORT < LONG")
    if not 0 <= args.margin < 1:
        raise ValueError(f"--margin {args.margin} must be a fraction in [0, 1), e.g. 0.05")
    if args.sampled_k0 and args.temperature > 0:
        raise ValueError("--sampled-k0 writes the greedy plan's sampled requests; a plan timed at "
                         "--temperature > 0 is itself the sampled requests' k: pass one of them")
    if args.temperature < 0:
        raise ValueError(f"--temperature {args.temperature} must be >= 0 (0: greedy requests' schedule)")
    max_batch = args.max_batch or max(batch_sizes)
    served_sizes = sorted(set(_ints(args.served_batch_sizes, "--served-batch-sizes"))) \
        if args.served_batch_sizes.strip() else []
    earlier = json.loads(Path(args.from_measurements).read_text()) if args.from_measurements else None
    # A plan from an earlier run keeps the dtype that run was timed in.
    flags = {**engine_flags(args.engine_flags), **({"dtype": earlier["dtype"]} if earlier else {})}
    if args.served_prompts < 1:
        raise ValueError(f"--served-prompts {args.served_prompts} must be >= 1 (default 16)")
    counts = served_counts(served_sizes, args.served_prompts)
    prompts = heldout_prompts(args.heldout, args.prompts)
    raw = json.loads(Path(args.systems).read_text())
    start = time.perf_counter()

    def log(line: str) -> None:
        print(f"[schedule {time.perf_counter() - start:5.0f}s] {line}", file=sys.stderr, flush=True)

    served_prompts = heldout_prompts(args.heldout, args.prompts + max(counts.values(), default=0))[args.prompts:]
    if earlier:
        accepted, times, served = measured_before(earlier, args.from_measurements, systems, batch_sizes,
                                                  served_sizes)
        # Served sizes the file lacks are measured now, each round beside plain decoding's.
        recorded = earlier.get("served_prompts_by_batch_size") or {
            str(b): b for b in earlier.get("served_batch_sizes", [])}  # before it: drained batches
        counts = {b: recorded.get(str(b), n) for b, n in counts.items()}
        missing = {b: n for b, n in counts.items() if str(b) not in recorded}
        if missing and earlier.get("served_tokens", args.served_tokens) != args.served_tokens:
            raise ValueError(f"--served-tokens {args.served_tokens}: {args.from_measurements} served "
                             f"{earlier['served_tokens']} tokens a request; pass that to add served sizes")
        if missing:
            log(f"measuring served batch sizes {sorted(missing)}, which {args.from_measurements} lacks")
            merge_served(served, measure_served(args, systems, flags, served_prompts, missing, log))
    else:
        accepted, times, served = measure_all(args, systems, flags, prompts, served_prompts, batch_sizes,
                                              counts, tokens, max_batch, log)
    plain = times[BASELINE][0]
    plain_costs = plain_step_costs(times)  # plain decoding's and every k = 0 step's
    out = {BASELINE: raw.get(BASELINE, {})}
    record = {"dtype": flags["dtype"], "temperature": earlier.get("temperature", 0.0) if earlier
              else args.temperature, "batch_sizes": batch_sizes, "tokens": tokens,
              "rounds": len(plain[batch_sizes[0]]), "heldout": args.heldout, "prompts": len(prompts),
              "margin": args.margin,
              "AR_step_costs_s": medians(times[BASELINE])[0], "AR_step_costs_s_by_round": plain,
              "plain_step_costs_s": plain_costs, "systems": {}}
    if served:
        record.update(served_batch_sizes=sorted(served[BASELINE][0]),
                      served_tokens=(earlier or {}).get("served_tokens", args.served_tokens),
                      served_prompts=f"the first of held-out conversations {args.prompts + 1}.."
                                     f"{args.prompts + max(counts.values())}",
                      served_prompts_by_batch_size={str(b): n for b, n in counts.items()},
                      AR_served_tokens_per_s_by_round=served[BASELINE][0])
    for system in systems:
        measured = medians(times[system.name])
        costs = {**schedule_model.linear_in_k(measured), 0: plain_costs}
        calibrated = served_calibration(accepted[system.name], costs, plain_costs, served, system.name)
        factors = calibrated.get("served_factors")
        ranges = schedule_model.schedule(accepted[system.name], costs, max_batch, args.margin, factors)
        summary = ", ".join(f"b {s}-{e}: k={k}" for s, e, k in ranges)
        log(f"{system.name}: acceptance per position {[round(a, 3) for a in accepted[system.name]]}; "
            f"schedule {summary}")
        out[system.name] = raw[system.name]
        suffix, planned = PLAN_ENTRIES[record["temperature"] > 0]
        out[system.name + suffix] = planned(raw[system.name], ranges, summary, args.sampled_k0)
        record["systems"][system.name] = dict(
            acceptance_per_pos=accepted[system.name], step_costs_s=costs, measured_step_costs_s=measured,
            step_costs_s_by_round=times[system.name],
            step_cost_over_plain=ratios_to_plain(times[system.name], plain), schedule=ranges,
            predicted_tokens_per_s=predictions(accepted[system.name], costs, plain_costs, ranges,
                                               batch_sizes, factors), **calibrated)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    measurements = Path(args.out).with_suffix(".measurements.json")
    measurements.write_text(json.dumps(record, indent=2) + "\n")
    log(f"wrote {args.out} and {measurements} in {time.perf_counter() - start:.0f} s")
    print(prediction_table(record))
    if served:
        print(served_table(record))
    return 0


def prediction_table(record: dict) -> str:
    lines = [f"dtype {record['dtype']}, T = {record.get('temperature', 0.0):g}; expected tokens/s (cost model)",
             "| system | batch | k | AR | fixed k | scheduled |", "|---|---|---|---|---|---|"]
    for name, measured in record["systems"].items():
        for row in measured["predicted_tokens_per_s"]:
            lines.append(f"| {name} | {row['batch']} | {row['k']} | {row['AR']:.1f} | "
                         f"{row['fixed']:.1f} | {row['scheduled']:.1f} |")
    return "\n".join(lines)


def served_table(record: dict) -> str:
    """Predicted (steady-state model) against served tokens/s, each over plain decoding's."""
    lines = [f"served batches of held-out prompts ({record['served_tokens']} tokens each) against the "
             "cost model, tokens/s over plain decoding's (median of paired rounds)",
             "| system | batch | k | predicted | served | served / predicted |", "|---|---|---|---|---|---|"]
    for name, measured in record["systems"].items():
        for k, by_b in sorted(measured["served_over_plain"].items(), key=lambda kv: int(kv[0])):
            for b, ratio in by_b.items():
                factor = measured["served_factors"].get(k, {}).get(b)  # none at k = 0: a plain step
                lines.append(f"| {name} | {b} | {k} | {measured['predicted_over_plain'][k][b]:.2f}x | "
                             f"{ratio:.2f}x | {'—' if factor is None else f'{factor:.2f}'} |")
    return "\n".join(lines)
