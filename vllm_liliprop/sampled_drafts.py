"""Sampled requests' own speculation schedule: at most k draft tokens at each batch size.

Why: vLLM's `num_speculative_tokens_per_batch_size` gives one k per batch size to every request,
but a sampled request's draft pays less and costs more than a greedy one's. Measured on two
cores (issue 34, c = 16, k = 3, DFlash, patches 12-13): verification's sampling took 1.35 ms of
an 82.5 ms step at T = 0 and 31.9 ms of 127.7 ms at T = 1, tau fell from ~1.6 to ~1.35, and DFlash
ran at 0.65x plain decoding at T = 1 (0.87x at c = 4) where it held 0.89-1.18x at T = 0. With
`sampled_k` a request sampled at T > 0 drafts at most the k of its batch size, 0 meaning none:
a step whose every request is sampled at k = 0 is then a plain decoding step for the target
(vLLM verifies no draft). The drafter still stores the step's context, so that a request can
draft again at a batch size whose k is above 0; where no batch size lets a sampled request draft
(`sampled_never_draft`), that context is never read and its pass (~4% of a step at batch 16,
measured 2026-12-05) is skipped too.

The cut goes through the host lists vLLM hands its scheduler, as `rule_draft_length`'s does
(draft_length.py). Output stays the target's: a shorter draft changes only how many tokens a
step verifies. Plain torch, no vLLM.
"""

from __future__ import annotations

import torch

from vllm_liliprop.draft_length import cut_drafts

__all__ = ["check_sampled_k", "sampled_k_at", "sampled_never_draft", "cut_sampled_rows"]


def check_sampled_k(value, where: str) -> tuple[tuple[int, int, int], ...]:
    """`sampled_k`: inclusive batch-size ranges [[start, end, k], ...] as vLLM's schedule takes
    them, non-overlapping, each k an integer >= 0. ValueError naming `where` and the fix."""
    example = "e.g. [[1, 2, 3], [3, 256, 0]]: 3 tokens at batch 1-2, none from batch 3 on"
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{where} = {value!r} must be a list of [start, end, k] batch-size ranges ({example})")
    ranges = []
    for item in value:
        ok = (isinstance(item, (list, tuple)) and len(item) == 3
              and all(isinstance(x, int) and not isinstance(x, bool) for x in item))
        if not ok or not 1 <= item[0] <= item[1] or item[2] < 0:
            raise ValueError(f"{where} entry {item!r} must be [start, end, k] with integers "
                             f"1 <= start <= end and k >= 0 ({example})")
        ranges.append(tuple(item))
    ranges.sort()
    for before, after in zip(ranges, ranges[1:]):
        if after[0] <= before[1]:
            raise ValueError(f"{where} ranges {list(before)} and {list(after)} overlap: give each "
                             f"batch size one k ({example})")
    return tuple(ranges)


def sampled_k_at(ranges, batch: int) -> int | None:
    """The k a sampled request may draft at this batch size; None where no range covers it."""
    for start, end, k in ranges or ():
        if start <= batch <= end:
            return k
    return None


def sampled_never_draft(ranges, max_batch: int) -> bool:
    """True where the ranges give k = 0 at every batch size 1..max_batch: a sampled request then
    never drafts, and its drafter context is never read (its temperature is fixed for life)."""
    return all(sampled_k_at(ranges, batch) == 0 for batch in range(1, max_batch + 1))


def cut_sampled_rows(token_ids: torch.Tensor, temperature: torch.Tensor | None, k: int | None) -> torch.Tensor:
    """Drafts [B, S] with the rows sampled at T > 0 (temperature [B]; None: all greedy) cut to
    k slots (the rest NO_DRAFT); greedy rows whole. No host reads."""
    if k is None or temperature is None or k >= token_ids.shape[1]:
        return token_ids
    greedy = temperature[: token_ids.shape[0]] <= 0
    return cut_drafts(token_ids, k, keep=greedy)
