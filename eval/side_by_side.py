"""--side-by-side: at c = 1, every system's engine open at once and each prompt run by plain
decoding and by every system in turn, AR's one run the reference of them all.

Why: --paired alone runs AR again beside each system, one system at a time, so a job of N
systems runs AR N + 1 times on every prompt (the 2026-12-05 main job: 161 s of AR references
beside each system's 130 s, 34 min for the speed pass of seven systems). Side by side, AR runs
once per prompt and every ratio is still taken between runs seconds apart on the same prompt;
the arms' order rotates prompt by prompt (eval.by_prompt.arm_order), so drift favours none.
AR's row is its reference runs.

Cost: one engine per system open at once (each with its own VLLM_CPU_KVCACHE_SPACE), and
per-engine counters (vllm_liliprop.vllm.engine_counters), since vLLM's process-wide metrics
follow only the engine built last. Stage rows at c = 1 run on the same open engines afterwards.
"""

from __future__ import annotations

from contextlib import ExitStack

from eval.by_prompt import REFERENCE, measure_side_by_side
from eval.systems import BASELINE


def prompt_sets(todo: list) -> list[list]:
    """The run measurements grouped by the prompts and sampling they share (benchmark, category,
    temperature, seed), in plan order: one group is measured prompt by prompt, all systems at once."""
    groups: dict[tuple, list] = {}
    for m in todo:
        if m.kind == "run":
            groups.setdefault((m.benchmark.name, m.category, m.temperature, m.seed), []).append(m)
    return list(groups.values())


def run_side_by_side(campaign, todo: list, offline, paired, bar) -> int:
    """Measure `todo` (every measurement at c = 1) with one engine per system open at once;
    returns the number of results rows written."""
    if paired is None:
        raise ValueError("side-by-side runs take their speedups from AR's runs beside each system's: "
                         "set Protocol.paired (--paired)")
    systems = list({m.system.name: m.system for m in todo if not m.system.is_baseline}.values())
    written = 0
    with ExitStack() as stack:
        paired.open(1)
        engines = {s.name: stack.enter_context(campaign.engine(offline, s, 1)) for s in systems}
        renders = {name: campaign.renderer(campaign._prompt_limit(e)) for name, e in engines.items()}
        for name, engine in engines.items():
            campaign.log(f"{name} c=1: {engine.serving()}")
        for group in prompt_sets(todo):
            bar.set_description(f"side by side c=1 {group[0].benchmark.name} T={group[0].temperature:g}")
            for m, rows, prompt_rows in _measure_group(campaign, group, engines, renders, offline, paired):
                campaign._log_truncated(m, rows[-1]["num_truncated"], paired.render.max_prompt_tokens)
                written += campaign.write(rows, prompt_rows)
                bar.update(1)
        engines[BASELINE], renders[BASELINE] = paired.engine, paired.render
        for m in (m for m in todo if m.kind == "stage"):
            bar.set_description(f"{m.system.name} c=1 {m.benchmark.name} stages")
            rows, prompt_rows = campaign._measure(engines[m.system.name], renders[m.system.name], m, offline)
            written += campaign.write(rows, prompt_rows)
            bar.update(1)
    return written


def _measure_group(campaign, group: list, engines: dict, renders: dict, offline, paired):
    """(measurement, rows, prompt rows) for each measurement of one prompt set, AR's included."""
    first, protocol = group[0], campaign.protocol
    conversations = [list(e.turns) for e in first.examples]
    sampling = offline.Sampling(first.temperature, protocol.max_tokens, campaign._seed(first),
                                protocol.ignore_eos)
    systems = [m.system.name for m in group if not m.system.is_baseline]
    for m in group:
        if not m.system.is_baseline:
            campaign._warm(engines[m.system.name], renders[m.system.name], m, offline)
    run_reference = paired.prompt_runner(first, sampling)  # warms AR's engine
    renders = {**renders, REFERENCE: paired.render}
    before = {name: renders[name].num_truncated for name in [*systems, REFERENCE]}

    def runner(name):
        return lambda i: engines[name].run_batch(conversations[i:i + 1], renders[name], sampling,
                                                 first_index=i)

    job_rates = campaign.results.job_rates(first.template, BASELINE)
    measured = measure_side_by_side(conversations, [e.id for e in first.examples],
                                    {name: runner(name) for name in systems}, run_reference,
                                    job_rates, protocol.repeats)
    for checked in measured[REFERENCE].references:
        paired.log_retries(first, checked, job_rates)
    for m in group:
        name = REFERENCE if m.system.is_baseline else m.system.name
        # Each repeat renders the prompts again: count each cut prompt once.
        truncated = (renders[name].num_truncated - before[name]) // protocol.repeats
        by_prompt = measured[name]
        row = campaign._run_row_dict(m, by_prompt.result, truncated, by_prompt.reference)
        yield m, [row], by_prompt.prompt_rows
