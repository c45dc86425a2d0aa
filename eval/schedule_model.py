"""The speculation schedule's cost model: the k per batch size that maximises expected tokens/s.

A step of a request drafting k tokens emits 1 + sum_{i<=k} p_i tokens on average, where p_i is
the fraction of drafts whose first i tokens were all accepted (vLLM's
`spec_decode_num_accepted_tokens_per_pos` over `num_drafts`: position i counts only when every
earlier one was accepted). A step of a batch of b requests at k costs cost(b, k) seconds, measured
on this host; k = 0 is the speculative engine's plain step (vLLM still runs the drafter over the
new context so that later drafts see it). Expected tokens/s at (b, k) = b * E(k) / cost(b, k).

Costs are measured at a few batch sizes; between them, cost is interpolated linearly in b, past
the largest the last one's k carries on (as vLLM carries a schedule's last range).
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


def interpolated_cost(costs: dict[int, float], batch: int) -> float:
    """Seconds per step at `batch` from costs measured at some batch sizes (linear between them,
    the nearest measured one outside)."""
    sizes = sorted(costs)
    if batch <= sizes[0]:
        return costs[sizes[0]]
    if batch >= sizes[-1]:
        return costs[sizes[-1]]
    right = bisect.bisect_left(sizes, batch)
    lo, hi = sizes[right - 1], sizes[right]
    share = (batch - lo) / (hi - lo)
    return costs[lo] + share * (costs[hi] - costs[lo])


def tokens_per_s(acceptance_per_pos: list[float], step_costs: dict[int, dict[int, float]],
                 batch: int, k: int) -> float:
    """Expected tokens/s of a batch of `batch` requests drafting k each.
    step_costs: k -> {batch size -> seconds per step}."""
    return batch * expected_tokens(acceptance_per_pos, k) / interpolated_cost(step_costs[k], batch)


def best_k(acceptance_per_pos: list[float], step_costs: dict[int, dict[int, float]],
           batch: int) -> int:
    """The k that maximises expected tokens/s at `batch` (the smaller k on a tie)."""
    return max(sorted(step_costs), key=lambda k: tokens_per_s(acceptance_per_pos, step_costs,
                                                                batch, k))


def schedule(acceptance_per_pos: list[float], step_costs: dict[int, dict[int, float]],
             max_batch: int) -> list[list[int]]:
    """The k schedule for batch sizes 1..max_batch as vLLM's ranges."""
    return as_ranges([best_k(acceptance_per_pos, step_costs, b) for b in range(1, max_batch + 1)])


def k_at(ranges: list[list[int]], batch: int) -> int:
    """The k a schedule gives `batch` (vLLM's rule: the range holding it, else the last before)."""
    chosen = ranges[0][2]
    for start, _, k in ranges:
        if start > batch:
            break
        chosen = k
    return chosen
