"""A speculation schedule as vLLM's inclusive ranges `[[start, end, k], ...]` of batch sizes, and
its one-line description (plain torch-free helpers shared by the eval and the offline driver)."""

from __future__ import annotations


def as_ranges(k_by_batch: list[int]) -> list[list[int]]:
    """[k at batch 1, k at batch 2, ...] -> [[start, end, k], ...], one range per run of equal k."""
    ranges: list[list[int]] = []
    for batch, k in enumerate(k_by_batch, start=1):
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = batch
        else:
            ranges.append([batch, batch, k])
    return ranges


def _one(start: int, end: int, k: int) -> str:
    batches = f"batch {start}" if start == end else f"batch {start}-{end}"
    return f"{k} at {batches}" + (" (plain decoding)" if k == 0 else "")


def describe_k(k_by_batch: list[int]) -> str:
    """[3, 3, 0, 0] -> "3 at batch 1-2, 0 at batch 3-4 (plain decoding)"."""
    return ", ".join(_one(*r) for r in as_ranges(k_by_batch))
