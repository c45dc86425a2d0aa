"""The speculation schedule's cost model: the k per batch size that maximises expected tokens/s.

A step of a request drafting k tokens emits 1 + sum_{i<=k} p_i tokens on average, where p_i is
the fraction of drafts whose first i tokens were all accepted (vLLM's
`spec_decode_num_accepted_tokens_per_pos` over `num_drafts`: position i counts only when every
earlier one was accepted). A step of a batch of b requests at k costs cost(b, k) seconds, measured
on this host; k = 0 is the speculative engine's plain step (vLLM still runs the drafter over the
new context so that later drafts see it). Expected tokens/s at (b, k) = b * E(k) / cost(b, k).

Costs are measured at a few batch sizes; between them, cost is interpolated linearly in b, past
the largest the last one's k carries on (as vLLM carries a schedule's last range).

Served batches (c requests started together, each to its own end) run slower than b steady-state
steps predict, and a drafting engine's more so: its batch drains unevenly (requests finish at
different steps while plain decoding's finish together), and its prefill also writes the drafter's
context. So where served batches were measured, each k's rate is scaled by its served calibration
(served over predicted, both relative to plain decoding at that batch size), interpolated between
the served sizes from 1 at batch 1, where one request has nothing to drain. At each batch
size the costs of k >= 1 are replaced by the least-squares line through them (`linear_in_k`): a
drafting step verifies b * (1 + k) tokens, so its cost grows about linearly in k, and on a shared
2-core host single medians are not even monotone (k = 7 once timed cheaper than k = 3 at batch
16, which a schedule then picked). k = 0 (no query pass, no verification) stays as measured.
"""

from __future__ import annotations

import bisect

from vllm_liliprop.k_ranges import as_ranges


def expected_tokens(acceptance_per_pos: list[float], k: int) -> float:
    """Tokens a request emits per step when it drafts k: 1 + the first k prefix acceptances."""
    if k > len(acceptance_per_pos):
        raise ValueError(f"k = {k} needs acceptance at {k} positions; measured at "
                         f"{len(acceptance_per_pos)} (measure with num_speculative_tokens >= {k})")
    return 1.0 + sum(acceptance_per_pos[:k])


def linear_in_k(step_costs: dict[int, dict[int, float]]) -> dict[int, dict[int, float]]:
    """step_costs (k -> {batch -> seconds}) with, at each batch size, the k >= 1 costs replaced by
    their least-squares line in k; k = 0 and a lone k >= 1 unchanged."""
    drafting = sorted(k for k in step_costs if k >= 1)
    fitted = {k: dict(by_b) for k, by_b in step_costs.items()}
    if len(drafting) < 2:
        return fitted
    mean_k = sum(drafting) / len(drafting)
    spread = sum((k - mean_k) ** 2 for k in drafting)
    for b in step_costs[drafting[0]]:
        mean_c = sum(step_costs[k][b] for k in drafting) / len(drafting)
        slope = sum((k - mean_k) * (step_costs[k][b] - mean_c) for k in drafting) / spread
        for k in drafting:
            fitted[k][b] = mean_c + slope * (k - mean_k)
    return fitted


def interpolated(values: dict[int, float], batch: int) -> float:
    """The value at `batch` from values measured at some batch sizes (linear between them, the
    nearest measured one outside)."""
    sizes = sorted(values)
    if batch <= sizes[0]:
        return values[sizes[0]]
    if batch >= sizes[-1]:
        return values[sizes[-1]]
    right = bisect.bisect_left(sizes, batch)
    lo, hi = sizes[right - 1], sizes[right]
    share = (batch - lo) / (hi - lo)
    return values[lo] + share * (values[hi] - values[lo])


def calibration(factors: dict[int, float] | None, batch: int) -> float:
    """Served over predicted at `batch`, from factors measured at some batch sizes (k's entry of
    served_factors); 1 at batch 1 unless measured there, 1 everywhere without factors."""
    return interpolated({1: 1.0, **factors}, batch) if factors else 1.0


def served_factors(served_over_plain: dict[int, dict[int, float]],
                   predicted_over_plain: dict[int, dict[int, float]]) -> dict[int, dict[int, float]]:
    """k -> {batch -> served ratio / predicted ratio}, both ratios to plain decoding at that batch,
    for every drafting k. k = 0 gets none: its step is a plain step (<1% apart when timed
    side by side, docs/measurements-smollm2.md, "What a k = 0 engine costs"), so a served k = 0
    batch against plain decoding measures only the host's noise, and one round's noise (0.79 at
    batch 4) made a k = 3 that steady state put at 0.81x plain decoding look better than k = 0
    up to batch 16 (LiLiCorr greedy, the AMX host's plan of 2026-12-07)."""
    return {k: {b: ratio / predicted_over_plain[k][b] for b, ratio in by_b.items()}
            for k, by_b in served_over_plain.items() if int(k) != 0}


def tokens_per_s(acceptance_per_pos: list[float], step_costs: dict[int, dict[int, float]],
                 batch: int, k: int, factors: dict[int, dict[int, float]] | None = None) -> float:
    """Expected tokens/s of a batch of `batch` requests drafting k each, scaled by k's served
    calibration where `factors` (served_factors) has one. step_costs: k -> {batch -> seconds}."""
    steady = batch * expected_tokens(acceptance_per_pos, k) / interpolated(step_costs[k], batch)
    return steady * calibration((factors or {}).get(k), batch)


def best_k(acceptance_per_pos: list[float], step_costs: dict[int, dict[int, float]],
           batch: int, margin: float = 0.0, factors: dict[int, dict[int, float]] | None = None) -> int:
    """The k that maximises expected tokens/s at `batch` (the smaller k on a tie); k = 0 (a plain
    step) unless the best drafting k beats it by more than `margin` (a fraction).

    Why a margin: the model's inputs are a few held-out prompts' acceptance and step costs timed
    on a shared host (+-10% between rounds), and a served batch mixes prefills into its steps.
    On SmolLM2 at batch 32 a k = 3 predicted level with plain decoding ran 0.80x of it
    (docs/measurements-smollm2.md, 2026-12-06): where drafting is predicted to gain only a few
    percent, a plain step is the safer pick. `factors`: tokens_per_s's served calibration."""
    def rate(k: int) -> float:
        return tokens_per_s(acceptance_per_pos, step_costs, batch, k, factors)

    best = max(sorted(step_costs), key=rate)
    if best != 0 and 0 in step_costs and rate(best) <= (1.0 + margin) * rate(0):
        return 0
    return best


def schedule(acceptance_per_pos: list[float], step_costs: dict[int, dict[int, float]],
             max_batch: int, margin: float = 0.0,
             factors: dict[int, dict[int, float]] | None = None) -> list[list[int]]:
    """The k schedule for batch sizes 1..max_batch as vLLM's ranges (best_k's margin and factors)."""
    return as_ranges([best_k(acceptance_per_pos, step_costs, b, margin, factors)
                      for b in range(1, max_batch + 1)])


def k_at(ranges: list[list[int]], batch: int) -> int:
    """The k a schedule gives `batch` (vLLM's rule: the range holding it, else the last before)."""
    chosen = ranges[0][2]
    for start, _, k in ranges:
        if start > batch:
            break
        chosen = k
    return chosen
