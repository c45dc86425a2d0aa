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


def test_a_step_that_completes_a_kv_block_must_write_what_is_pending():
    # Blocks of 4: position 7 is the last of block 1, which a prefix cache may then serve.
    deferred = DeferredContext(kv_block_size=4)
    _step(deferred, [5, 9], ["a", "b"], [1, 1])
    assert not deferred.must_write()
    _step(deferred, [6, 10], ["a", "b"], [1, 1])
    assert not deferred.must_write()
    _step(deferred, [7, 11], ["a", "b"], [1, 1])
    assert deferred.must_write()
    assert deferred.take()[1].tolist() == [5, 9, 6, 10, 7, 11] and not deferred.must_write()
    _step(deferred, [8, 12], ["a", "b"], [1, 1])
    assert not deferred.must_write()
    # Without a prefix cache only the token count forces a write.
    uncached = DeferredContext(max_tokens=3)
    _step(uncached, [3, 7], ["a", "b"], [1, 1])
    assert not uncached.must_write()
    _step(uncached, [4, 8], ["a", "b"], [1, 1])
    assert uncached.must_write()
