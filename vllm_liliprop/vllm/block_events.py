"""What a step's scheduler output says about the drafter's KV blocks, for the deferred context
(deferred_context.py): the requests that left, the blocks just handed to a request, and the
blocks a request found in the prefix cache. Reads vLLM's `SchedulerOutput` fields only."""

from __future__ import annotations

__all__ = ["departed_requests", "block_events"]


def departed_requests(scheduler_output) -> set[str]:
    """Requests whose blocks were freed since the last step: finished or preempted."""
    return set(scheduler_output.finished_req_ids) | set(scheduler_output.preempted_req_ids or ())


def block_events(scheduler_output, group: int, block_size: int,
                 running: bool = True) -> tuple[list[int], list[int]]:
    """(allocated, hit): the block ids of KV cache group `group` that the scheduler handed to a
    request this step, and those that a new or resumed request found in the prefix cache (its
    first ceil(num_computed_tokens / block_size) blocks: a hit covers whole blocks, and where a
    whole prompt hits vLLM recomputes its last token, in the last block hit). `running`: also
    the blocks added to running requests (only a parked block's owner change needs them)."""
    allocated: list[int] = []
    hit: list[int] = []

    def admitted(blocks: list[int], computed: int) -> None:
        cut = -(-computed // block_size)
        hit.extend(blocks[:cut])
        allocated.extend(blocks[cut:])

    for request in scheduler_output.scheduled_new_reqs:
        admitted(request.block_ids[group], request.num_computed_tokens)
    cached = scheduler_output.scheduled_cached_reqs
    resumed = cached.resumed_req_ids
    if not running and not resumed:
        return allocated, hit
    for rid, blocks, computed in zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens):
        if blocks is None:
            continue
        if rid in resumed:  # its whole block list, hits first
            admitted(blocks[group], computed)
        elif running:
            allocated.extend(blocks[group])
    return allocated, hit
