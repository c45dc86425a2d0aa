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
        renders = {name: campaign.renderer(campaign.prompt_limit(e)) for name, e in engines.items()}
        for name, engine in engines.items():
            campaign.log(f"{name} c=1: {engine.serving()}")
        for group in prompt_sets(todo):
            bar.set_description(f"side by side c=1 {group[0].benchmark.name} T={group[0].temperature:g}")
            for m, by_prompt, truncated in campaign.measure_prompt_set(group, engines, renders, offline, paired):
                campaign.log_truncated(m, truncated, paired.render.max_prompt_tokens)
                row = campaign.run_row_dict(m, by_prompt.result, truncated, by_prompt.reference)
                written += campaign.write([row], by_prompt.prompt_rows)
                bar.update(1)
        engines[BASELINE], renders[BASELINE] = paired.engine, paired.render
        for m in (m for m in todo if m.kind == "stage"):
            bar.set_description(f"{m.system.name} c=1 {m.benchmark.name} stages")
            rows, prompt_rows = campaign.measure(engines[m.system.name], renders[m.system.name], m, offline)
            written += campaign.write(rows, prompt_rows)
            bar.update(1)
    return written
