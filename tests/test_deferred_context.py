"""The deferred context of plain steps (vllm_liliprop/vllm/deferred_context.py): pending tokens
come back oldest first, and a request that left the batch takes its tokens with it."""

import torch

from vllm_liliprop.vllm.deferred_context import DeferredContext, request_rows


def _step(deferred, positions, req_ids, lengths, width=3):
    n = len(positions)
    states = torch.arange(n * width, dtype=torch.float32).reshape(n, width) + 100 * positions[0]
    rows = request_rows(torch.tensor([0] + lengths).cumsum(0), n, "cpu")
    return rows is not None and deferred.add(states, torch.tensor(positions),
                                             torch.tensor(positions) + 1000, rows, req_ids)


def test_pending_tokens_come_back_oldest_first_and_once():
    deferred = DeferredContext()
    assert deferred.take() is None
    assert _step(deferred, [5, 9], ["a", "b"], [1, 1])
    assert _step(deferred, [6, 10, 11], ["a", "b"], [1, 2])
    assert deferred.num_pending == 5 == deferred.num_deferred_tokens
    states, positions, slots = deferred.take()
    assert positions.tolist() == [5, 9, 6, 10, 11] and slots.tolist() == [1005, 1009, 1006, 1010, 1011]
    assert states.shape == (5, 3) and deferred.take() is None


def test_a_request_that_left_the_batch_drops_its_tokens():
    deferred = DeferredContext()
    _step(deferred, [5, 9, 20], ["a", "b", "c"], [1, 1, 1])
    _step(deferred, [6, 21, 22], ["a", "c"], [1, 2])
    deferred.keep_requests(["c", "a"])  # b finished: its slots may be someone else's now
    assert deferred.num_pending == 5
    _, positions, _ = deferred.take()
    assert positions.tolist() == [5, 20, 6, 21, 22] and deferred.num_dropped_tokens == 1
    assert deferred.num_pending == 0
    _step(deferred, [7], ["a"], [1])
    deferred.keep_requests(["c", "a"])  # the same batch as before: nobody left
    assert deferred.num_pending == 1
    deferred.keep_requests(["d"])
    assert deferred.take() is None and deferred.num_dropped_tokens == 2 and deferred.num_pending == 0


def test_a_context_that_is_not_exactly_the_requests_tokens_is_not_kept():
    deferred = DeferredContext()
    assert not _step(deferred, [5, 9, 10], ["a", "b"], [1, 1])  # one padding token
    assert deferred.num_pending == 0


def test_only_the_token_count_or_a_prefix_hit_forces_a_write():
    # Blocks of 4: completing block 1 (position 7) no longer writes; a prefix hit does.
    deferred = DeferredContext(kv_block_size=4)
    for step in range(3):
        _step(deferred, [5 + step, 9 + step], ["a", "b"], [1, 1])
        assert not deferred.must_write()
    assert deferred.hit_blocks([77]) is None and deferred.must_write()  # nothing parked there
    assert deferred.take()[1].tolist() == [5, 9, 6, 10, 7, 11] and not deferred.must_write()
    uncached = DeferredContext(max_tokens=3)
    _step(uncached, [3, 7], ["a", "b"], [1, 1])
    assert not uncached.must_write()
    _step(uncached, [4, 8], ["a", "b"], [1, 1])
    assert uncached.must_write()


def _request(deferred, first, last, req_id, slot_base):
    """Request req_id's positions first..last in one plain step, slot = slot_base + position."""
    positions = torch.arange(first, last + 1)
    states = positions[:, None].float().expand(-1, 2).clone()
    deferred.add(states, positions, positions + slot_base, torch.zeros_like(positions), [req_id])


def test_a_departed_request_parks_its_full_blocks_and_drops_the_rest():
    # Blocks of 4, request a at slots 100 + position (blocks 25, 26, 27): positions 0-9 computed,
    # so blocks 25 and 26 are full and 27 (positions 8, 9) is not.
    deferred = DeferredContext(kv_block_size=4)
    _request(deferred, 0, 5, "a", 100)
    _request(deferred, 6, 9, "a", 100)
    _request(deferred, 0, 2, "b", 200)
    deferred.keep_requests(["a", "b"])
    deferred.keep_requests(["b"])  # a left
    assert deferred.num_parked == 8 and deferred.num_dropped_tokens == 2 and deferred.num_pending == 3
    assert sorted(deferred._parked) == [25, 26]
    assert deferred.take()[1].tolist() == [0, 1, 2]  # a drafting pass writes b only
    deferred.forget_blocks([26, 90])  # block 26 handed to another request
    assert deferred.num_parked == 4 and deferred.num_dropped_tokens == 6
    states, positions, slots = deferred.hit_blocks([25, 31])
    assert positions.tolist() == [0, 1, 2, 3] and slots.tolist() == [100, 101, 102, 103]
    assert states[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert deferred.num_parked == 0 and deferred.num_revived_tokens == 4
    assert deferred.hit_blocks([25]) is None  # written once


def test_departures_named_by_the_scheduler_and_the_parked_bound():
    deferred = DeferredContext(kv_block_size=4, max_parked_bytes=8 * 2 * 4)  # 8 tokens of 2 floats
    for index, rid in enumerate("abc"):
        _request(deferred, 0, 3, rid, 1000 * (index + 1))  # one full block each
    deferred.keep_requests(["a", "b", "c"])
    deferred.depart({"a", "b"})
    assert deferred.num_parked == 8 and deferred.num_parked_bytes == 64 and deferred.num_pending == 4
    deferred.keep_requests(["c"])  # the scheduler said so already: nothing more leaves
    assert deferred.num_parked == 8 and deferred.num_pending == 4
    deferred.depart({"c"})  # a third block: a's, the oldest, goes
    assert sorted(deferred._parked) == [500, 750] and deferred.num_dropped_tokens == 4
    deferred.drop_parked()  # the scheduler's blocks could not be followed
    assert deferred.num_parked == deferred.num_parked_bytes == 0 and deferred.num_dropped_tokens == 12
    # Without a prefix cache a departed request's tokens are all dropped.
    uncached = DeferredContext()
    _request(uncached, 0, 7, "a", 0)
    uncached.depart({"a"})
    assert uncached.num_parked == 0 and uncached.num_dropped_tokens == 8 and uncached.take() is None
