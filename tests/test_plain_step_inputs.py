"""A plain step's proposer inputs computed without vLLM's per-request kernels
(deferred_context.context_slots, proposer.plain_step_next_tokens) equal what those kernels write,
checked against vLLM 0.32's own CPU implementations."""

import pytest
import torch

cpu_kernels = pytest.importorskip("vllm.utils.cpu_triton_utils")

from vllm_liliprop.vllm.deferred_context import context_slots, request_rows  # noqa: E402
from vllm_liliprop.vllm.proposer import plain_step_next_tokens  # noqa: E402


def _vllm_context_slots(positions, query_start_loc, block_table, block_size):
    """The context slots vLLM's DFlash input kernel writes (one query a request, k = 0)."""
    batch, n = query_start_loc.shape[0] - 1, positions.shape[0]
    out_slots = torch.full((n,), -7, dtype=torch.int64)
    cpu_kernels._copy_and_expand_dflash_inputs_kernel_impl(
        torch.zeros(batch, dtype=torch.int64), positions, torch.zeros(batch, dtype=torch.int64),
        torch.zeros(n, dtype=torch.int64), torch.zeros(batch, dtype=torch.int64), out_slots,
        torch.zeros(batch, dtype=torch.int64), torch.zeros(0, dtype=torch.int32), block_table,
        block_table.stride(0), query_start_loc, 0, 0, block_size, 1, 0, n)
    return out_slots


@pytest.mark.parametrize("lengths", [[1] * 7, [3, 1, 130, 2], [1]])
def test_context_slots_are_the_kernels(lengths):
    generator = torch.Generator().manual_seed(len(lengths))
    block_size, width = 16, 12
    block_table = torch.randperm(200, generator=generator)[: len(lengths) * width].reshape(-1, width)
    block_table = block_table.to(torch.int32)
    starts = torch.randint(0, block_size * width - 131, (len(lengths),), generator=generator)
    positions = torch.cat([torch.arange(s, s + n) for s, n in zip(starts.tolist(), lengths)])
    query_start_loc = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    rows = request_rows(query_start_loc, positions.shape[0], "cpu")
    ours = context_slots(positions, rows, block_table, block_size)
    assert torch.equal(ours, _vllm_context_slots(positions, query_start_loc, block_table, block_size))


def test_a_padded_batch_has_no_request_rows():
    assert request_rows(torch.tensor([0, 1, 3]), 5, "cpu") is None
    assert request_rows(torch.tensor([0, 1, 3]), 3, "cpu").tolist() == [0, 1, 1]


def _vllm_next_tokens(sampled, discard, backup, vocab_size):
    batch, width = sampled.shape
    next_ids = torch.empty(batch, dtype=torch.int32)
    counts = next_ids.new_empty(batch)
    cpu_kernels._eagle_prepare_next_token_padded_kernel_impl(
        sampled, discard, backup, next_ids, counts, vocab_size, width, batch)
    return next_ids, counts


def test_plain_step_next_tokens_are_the_kernels():
    sampled = torch.tensor([[5], [0], [48], [17]])
    discard = torch.zeros(6, dtype=torch.bool)  # the runner's mask is max_num_reqs long
    backup = torch.full((4,), 3, dtype=torch.int32)
    ours = plain_step_next_tokens(sampled, discard, 49)
    theirs = _vllm_next_tokens(sampled, discard[:4], backup, 49)
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(ours, theirs))


@pytest.mark.parametrize("case", ["discarded", "verified drafts", "invalid token"])
def test_plain_step_next_tokens_leave_other_steps_to_vllm(case):
    sampled = {"verified drafts": torch.tensor([[5, -1], [7, 8]]),
               "invalid token": torch.tensor([[5], [-1]])}.get(case, torch.tensor([[5], [7]]))
    discard = torch.tensor([False, case == "discarded"])
    assert plain_step_next_tokens(sampled, discard, 49) is None
