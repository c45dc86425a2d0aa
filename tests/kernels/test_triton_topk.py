"""Triton fused log-softmax + top-K vs vllm_liliprop.heads.candidates.topk_candidates (interpreted)."""

import pytest
import torch

pytest.importorskip("triton")

from vllm_liliprop.heads.candidates import topk_candidates as torch_topk  # noqa: E402
from vllm_liliprop.kernels import triton_topk  # noqa: E402

NAN, INF = float("nan"), float("inf")
# The interpreter evaluates non-finite rows with numpy, which warns about inf - inf and log(0).
nonfinite = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _logits(rows, vocab, seed, dtype=torch.float32):
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _assert_matches_reference(logits, k, **launch):
    ids, log_probs = triton_topk.topk_candidates(logits, k, **launch)
    ref_ids, ref_log_probs = torch_topk(logits, k)
    assert ids.dtype == torch.int64 and log_probs.dtype == torch.float32
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(log_probs, ref_log_probs, rtol=0, atol=2e-5, equal_nan=True)


@pytest.mark.parametrize(
    "rows, vocab, k, launch",
    [
        (1, 1000, 16, {}),
        (64, 1000, 1, {}),
        (64, 1000, 16, {}),
        # several vocabulary blocks per program and several programs per row, last one partial
        (5, 1000, 16, {"block_v": 128, "num_splits": 3}),
        (3, 1000, 16, {"block_v": 64, "num_splits": 16}),
        (2, 37, 16, {"block_v": 16, "num_splits": 2}),
    ],
)
def test_matches_reference(rows, vocab, k, launch):
    _assert_matches_reference(_logits(rows, vocab, seed=rows * vocab + k), k, **launch)


def test_full_vocabulary_row():
    _assert_matches_reference(_logits(1, 151_936, seed=7), 16)


def test_low_precision_logits_are_ranked_after_an_exact_upcast():
    _assert_matches_reference(_logits(4, 1000, seed=3, dtype=torch.bfloat16), 8, block_v=256, num_splits=2)


def test_exact_ties_go_to_the_lowest_token_id():
    # Few distinct values: many equal logits straddle the K-th place, across blocks and splits.
    logits = torch.randint(0, 4, (6, 1000), generator=torch.Generator().manual_seed(0)).float()
    logits[0] = 0.0
    logits[0, [3, 1]] = torch.tensor([-0.0, 0.0])  # -0.0 and +0.0 are equal logits
    _assert_matches_reference(logits, 16, block_v=128, num_splits=4)
    ids, _ = triton_topk.topk_candidates(logits[:1], 4)
    assert ids.tolist() == [[0, 1, 2, 3]]


@nonfinite
def test_negative_infinity_entries_rank_last_by_token_id():
    logits = _logits(4, 1000, seed=1)
    logits[logits < 0.5] = -INF
    logits[1, :] = -INF
    logits[1, [700, 20]] = 2.0  # only two finite logits: the -inf ones fill in from id 0
    logits[2, :] = -INF  # no finite logit: log Z = -inf, log-probs NaN as in torch
    ids, log_probs = triton_topk.topk_candidates(logits, 8, block_v=256, num_splits=2)
    ref_ids, ref_log_probs = torch_topk(logits, 8)
    assert torch.equal(ids, ref_ids)
    assert ids[1].tolist() == [20, 700, 0, 1, 2, 3, 4, 5]
    assert ids[2].tolist() == list(range(8)) and log_probs[2].isnan().all()
    torch.testing.assert_close(log_probs, ref_log_probs, rtol=0, atol=2e-5, equal_nan=True)


@nonfinite
def test_positive_infinity_follows_torch_log_softmax():
    logits = _logits(2, 1000, seed=2)
    logits[0, 123] = INF
    ids, log_probs = triton_topk.topk_candidates(logits, 4, block_v=256, num_splits=3)
    ref_ids, ref_log_probs = torch_topk(logits, 4)
    assert torch.equal(ids, ref_ids) and ids[0, 0] == 123
    torch.testing.assert_close(log_probs, ref_log_probs, rtol=0, atol=2e-5, equal_nan=True)


@nonfinite
def test_nan_ranks_first_and_poisons_only_its_row():
    logits = _logits(3, 1000, seed=4)
    logits[1, [900, 5, 400]] = torch.tensor([NAN, -NAN, NAN])  # either sign bit ranks first
    logits[2, :] = -NAN
    ids, log_probs = triton_topk.topk_candidates(logits, 8, block_v=256, num_splits=2)
    # NaN ranks above every number, lowest id first, then the rest by logit.
    finite_row = logits[1].clone()
    finite_row[[900, 5, 400]] = -INF
    assert ids[1].tolist() == [5, 400, 900] + torch_topk(finite_row[None], 5)[0][0].tolist()
    assert ids[2].tolist() == list(range(8))
    assert log_probs[1:].isnan().all()
    # Other rows are untouched by a NaN in their neighbours.
    ref_ids, ref_log_probs = torch_topk(logits[:1], 8)
    assert torch.equal(ids[:1], ref_ids)
    torch.testing.assert_close(log_probs[:1], ref_log_probs, rtol=0, atol=2e-5)


def test_strided_rows_are_read_in_place():
    logits = _logits(4, 2000, seed=5)[:, ::2]  # last dim stride 2: copied once, same results
    _assert_matches_reference(logits, 8, block_v=256)
    _assert_matches_reference(_logits(8, 1000, seed=6)[::2], 8, block_v=256)  # row stride 2000


def test_empty_batch_launches_nothing(forbid_launch):
    forbid_launch(triton_topk, "_topk_partial_kernel", "_topk_merge_kernel")
    ids, log_probs = triton_topk.topk_candidates(torch.empty(0, 1000), 16)
    assert ids.shape == (0, 16) and ids.dtype == torch.int64
    assert log_probs.shape == (0, 16) and log_probs.dtype == torch.float32


@pytest.mark.parametrize(
    "logits, k, launch, field",
    [
        (torch.zeros(2, 10), 11, {}, "k"),
        (torch.zeros(2, 10), 0, {}, "k"),
        (torch.zeros(2, 3, 10), 2, {}, "logits"),
        (torch.zeros(2, 10, dtype=torch.int64), 2, {}, "logits"),
        (torch.zeros(2, 10), 2, {"block_v": 100}, "block_v"),
    ],
)
def test_bad_input_names_the_field(logits, k, launch, field):
    with pytest.raises(ValueError, match=field):
        triton_topk.topk_candidates(logits, k, **launch)
