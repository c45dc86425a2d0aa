"""What a scheduler output says about the drafter's KV blocks (vllm_liliprop/vllm/block_events.py),
on outputs shaped as vLLM 0.32's `SchedulerOutput` (its new-request and cached-request fields)."""

from types import SimpleNamespace

from vllm_liliprop.vllm.block_events import block_events, departed_requests


def _output(new=(), cached=(), resumed=(), finished=(), preempted=None):
    """new: (block ids per group, num_computed_tokens); cached: (req_id, new block ids per group
    or None, num_computed_tokens)."""
    news = [SimpleNamespace(block_ids=blocks, num_computed_tokens=computed) for blocks, computed in new]
    cached_reqs = SimpleNamespace(req_ids=[c[0] for c in cached], new_block_ids=[c[1] for c in cached],
                                  num_computed_tokens=[c[2] for c in cached], resumed_req_ids=set(resumed))
    return SimpleNamespace(scheduled_new_reqs=news, scheduled_cached_reqs=cached_reqs,
                           finished_req_ids=set(finished), preempted_req_ids=preempted)


def test_hits_are_the_blocks_a_new_or_resumed_request_found_cached():
    # Blocks of 16, two KV groups (the drafter's is group 1).
    output = _output(new=[(([1, 2, 3], [7, 8, 9]), 32), (([4], [10]), 0), (([5, 6], [11, 12]), 31)],
                     cached=[("r", ([13], [14]), 80), ("s", None, 40), ("p", ([15, 16], [17, 18]), 16)],
                     resumed=["p"])
    allocated, hit = block_events(output, group=1, block_size=16)
    # 32 computed: two whole blocks; 31 (a whole prompt hit, its last token recomputed): both.
    assert hit == [7, 8, 11, 12, 17] and allocated == [9, 10, 14, 18]
    allocated, hit = block_events(output, group=1, block_size=16, running=False)
    assert hit == [7, 8, 11, 12, 17] and allocated == [9, 10, 18]


def test_departures_are_the_finished_and_the_preempted():
    assert departed_requests(_output(finished=["a"], preempted={"b"})) == {"a", "b"}
    assert departed_requests(_output(finished=["a"])) == {"a"}
