"""A run row at concurrency 1 measured one prompt at a time, with --paired its AR reference
interleaved prompt by prompt.

Why: an interval over prompts needs prompts measured independently. Measured as one batch, a
row's prompts share one AR reference batch run seconds earlier, so a slow moment of the machine
shifts every prompt of the row alike and resampling prompts would not see it. Here AR runs on
each prompt right beside the system's run of the same prompt, in alternating order (AR first on
even prompts, the system first on odd ones; with several systems side by side the order rotates,
`arm_order`), so that a machine speeding up or slowing down over a row favours neither arm. At
c = 1 the engine runs one request at a time anyway, so a row's
work is that of its batch; each prompt starts on an emptied prefix cache, both arms alike.

With `repeats` R > 1 each prompt is timed R times per arm, the order alternating run after run
(AR, system, system, AR, ...), and each arm keeps its fastest run: on a machine shared with
other jobs, a run is only ever slowed down (measured here: AR on consecutive prompts at 5 to 59
tokens/s), so the fastest of R estimates the run's own cost, and the ratio of two fastest runs
the speedup on a machine to itself. Counters and outputs are the fastest run's (at T = 0 every
repeat generates the same tokens).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from eval.paired import CheckedReference, checked_reference
from plots.paired import is_outlier

# The AR arm's name among the arms of a prompt (arm_order) and its key in measure_side_by_side's answer.
REFERENCE = "reference"


@dataclass(frozen=True)
class Totals:
    """What the runner reads of vLLM's BatchResult, summed over a row's prompts."""
    output_tokens: int
    wall_s: float
    counters: object = None  # SpecDecodeCounters (supports +)
    output_hashes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ByPrompt:
    result: Totals
    reference: CheckedReference | None  # the prompts' references together; outlier if any is
    prompt_rows: list[dict]  # eval.prompt_results.PROMPT_COLUMNS
    references: list[CheckedReference]  # one per prompt (for the runner's log)


def arm_order(arms: Sequence[str], turn: int) -> list[str]:
    """The arms' running order on a prompt's turn-th round (prompt index + repeat): rotated one
    place each round, so with two arms AR and the system take turns going first, and with more
    each arm runs at every place of the order equally often."""
    shift = turn % len(arms)
    return list(arms[shift:]) + list(arms[:shift])


def measure_by_prompt(conversations: Sequence[Sequence[str]], example_ids: Sequence[str],
                      run_system: Callable[[int], object],
                      run_reference: Callable[[int], object] | None = None,
                      job_rates: Sequence[float] = (), repeats: int = 1) -> ByPrompt:
    """run_system(i) / run_reference(i): the system's / AR's BatchResult on conversation i alone.
    Each reference run is checked against job_rates (eval.paired) like a whole row's was."""
    return measure_side_by_side(conversations, example_ids, {"system": run_system}, run_reference,
                                job_rates, repeats)["system"]


def measure_side_by_side(conversations: Sequence[Sequence[str]], example_ids: Sequence[str],
                         run_systems: dict[str, Callable[[int], object]],
                         run_reference: Callable[[int], object] | None = None,
                         job_rates: Sequence[float] = (), repeats: int = 1) -> dict[str, ByPrompt]:
    """measure_by_prompt for several systems at once (eval.side_by_side): each prompt runs on AR
    and on every system in turn, and AR's run is the reference of every system's. Returns each
    system's ByPrompt by name and, with run_reference, AR's own under REFERENCE (its runs as a
    row: AR's row of a side-by-side job)."""
    arms = ([REFERENCE] if run_reference is not None else []) + list(run_systems)
    results = {name: [] for name in run_systems}
    rows = {name: [] for name in run_systems}
    references = []
    for i, example_id in enumerate(example_ids[: len(conversations)]):
        runs = {arm: [] for arm in arms}
        for r in range(repeats):
            for arm in arm_order(arms, i + r):
                if arm == REFERENCE:
                    runs[arm].append(checked_reference(lambda: run_reference(i), list(job_rates)))
                else:
                    runs[arm].append(run_systems[arm](i))
        reference = _fastest_reference(runs[REFERENCE]) if run_reference is not None else None
        references.append(reference)
        for name in run_systems:
            system = min(runs[name], key=lambda result: result.wall_s)
            results[name].append(system)
            rows[name].append(_prompt_row(i, example_id, system, reference))
    checked = [r for r in references if r is not None]
    together = _together(checked, job_rates) if checked else None
    by_system = {name: ByPrompt(_totals(results[name]), together, rows[name], checked)
                 for name in run_systems}
    if checked:
        own = [_prompt_row(i, example_ids[i], r.result, None) for i, r in enumerate(references)]
        by_system[REFERENCE] = ByPrompt(_totals([r.result for r in checked]), None, own, checked)
    return by_system


def _fastest_reference(checked: list[CheckedReference]) -> CheckedReference:
    """The fastest run that is not an outlier (else the fastest), with every repeat's retries."""
    usable = [c for c in checked if not c.outlier] or checked
    best = max(usable, key=lambda c: c.tokens_per_s)
    return CheckedReference(best.result, sum(c.retries for c in checked), best.outlier)


def _prompt_row(i: int, example_id: str, result, reference: CheckedReference | None) -> dict:
    counters = result.counters
    return {"prompt": i, "example_id": example_id, "output_tokens": result.output_tokens,
            "wall_s": result.wall_s, "num_drafts": counters.num_drafts,
            "num_accepted_tokens": counters.num_accepted_tokens,
            "paired_ar_output_tokens": reference.result.output_tokens if reference else math.nan,
            "paired_ar_wall_s": reference.result.wall_s if reference else math.nan,
            "paired_ar_retries": reference.retries if reference else math.nan,
            "paired_ar_outlier": int(reference.outlier) if reference else math.nan}


def _totals(results: list) -> Totals:
    counters = results[0].counters
    for r in results[1:]:
        counters = counters + r.counters
    return Totals(sum(r.output_tokens for r in results), sum(r.wall_s for r in results), counters,
                  [h for r in results for h in r.output_hashes])


def _together(references: list[CheckedReference], job_rates: Sequence[float]) -> CheckedReference:
    """The row's reference: its prompts' runs summed, an outlier when that sum's tokens/s is one
    (the rule a row's reference batch met before rows were measured prompt by prompt; one prompt
    still stalled after its retries no longer costs the row its speedup)."""
    result = Totals(sum(r.result.output_tokens for r in references), sum(r.result.wall_s for r in references))
    rate = result.output_tokens / result.wall_s if result.wall_s > 0 else math.nan
    return CheckedReference(result, sum(r.retries for r in references), is_outlier(rate, list(job_rates)))
