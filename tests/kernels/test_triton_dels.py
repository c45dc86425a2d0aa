"""The Triton DeLS argmax kernel vs vllm_liliprop.heads.dels.dels_fuse (interpreted)."""

import pytest
import torch

pytest.importorskip("triton")

from vllm_liliprop.heads.dels import dels_fuse  # noqa: E402
from vllm_liliprop.kernels import triton_dels  # noqa: E402

NAN, INF = float("nan"), float("inf")


def _inputs(rows, vocab, seed, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    long_logits = torch.randn(rows, vocab, generator=generator).to(dtype)
    short_logits = (2 * torch.randn(rows, vocab, generator=generator)).to(dtype)
    log_prior = torch.log_softmax(torch.randn(vocab, generator=generator), dim=0)
    alpha = torch.rand(rows, generator=generator)
    return long_logits, short_logits, log_prior, alpha


def _assert_matches_reference(long_logits, short_logits, log_prior, alpha, beta, **launch):
    fused = dels_fuse(long_logits, short_logits, log_prior, alpha, beta)
    ids = triton_dels.dels_argmax(long_logits, short_logits, log_prior, alpha, beta, **launch)
    assert ids.dtype == torch.int64 and ids.shape == (long_logits.shape[0],)
    assert torch.equal(ids, fused.argmax(dim=-1))


@pytest.mark.parametrize(
    "rows, vocab, launch",
    [
        (1, 1000, {}),
        (64, 1000, {}),
        # several vocabulary blocks per program and several programs per row, last one partial
        (5, 1000, {"block_v": 128, "num_splits": 3}),
        (3, 1000, {"block_v": 64, "num_splits": 16}),
    ],
)
def test_matches_reference(rows, vocab, launch):
    long_logits, short_logits, log_prior, alpha = _inputs(rows, vocab, seed=rows)
    _assert_matches_reference(long_logits, short_logits, log_prior, alpha, 0.3, **launch)


def test_full_vocabulary_row():
    long_logits, short_logits, log_prior, alpha = _inputs(1, 151_936, seed=1)
    _assert_matches_reference(long_logits, short_logits, log_prior, alpha, 0.3)


@pytest.mark.parametrize(
    "alpha, beta",
    [
        (0.0, 0.0),  # plain DFlash: argmax of the long logits
        (torch.tensor(0.3), torch.tensor(0.5)),  # 0-dim tensors
        (torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.tensor([1.0, 0.0, 0.5, 2.0])),  # per row
        ([0.1, 0.2, 0.3, 0.4], 1),  # a list and an int, as dels_fuse accepts them
    ],
)
def test_weight_forms(alpha, beta):
    long_logits, short_logits, log_prior, _ = _inputs(4, 1000, seed=2)
    _assert_matches_reference(long_logits, short_logits, log_prior, alpha, beta, block_v=256)


def test_low_precision_logits():
    long_logits, short_logits, log_prior, alpha = _inputs(4, 1000, seed=3, dtype=torch.bfloat16)
    _assert_matches_reference(long_logits, short_logits, log_prior, alpha, 0.3, block_v=256)


def test_exact_ties_go_to_the_lowest_token_id():
    long_logits, short_logits, log_prior, alpha = _inputs(8, 1000, seed=4)
    winners = dels_fuse(long_logits, short_logits, log_prior, alpha, 0.3).argmax(dim=-1)
    for row, winner in enumerate(winners.tolist()):
        twin = (winner * 7 + 3) % 1000  # copy the winning column to another token id
        for tensor in (long_logits[row], short_logits[row]):
            tensor[twin] = tensor[winner]
        log_prior[twin] = log_prior[winner]
    ids = triton_dels.dels_argmax(long_logits, short_logits, log_prior, alpha, 0.3, block_v=128, num_splits=4)
    fused = dels_fuse(long_logits, short_logits, log_prior, alpha, 0.3)
    assert torch.equal(ids, fused.argmax(dim=-1))
    assert torch.equal(fused.gather(1, ids[:, None]).squeeze(1), fused.max(dim=-1).values)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_non_finite_long_logits_follow_torch_argmax():
    long_logits, short_logits, log_prior, alpha = _inputs(4, 1000, seed=5)
    long_logits[0, [640, 30]] = torch.tensor([NAN, -NAN])  # NaN of either sign outranks all
    long_logits[1] = -INF  # fused is -inf everywhere: id 0
    long_logits[2, 17] = INF
    long_logits[3, ::2] = -INF
    _assert_matches_reference(long_logits, short_logits, log_prior, alpha, 0.3, block_v=256, num_splits=2)
    assert triton_dels.dels_argmax(long_logits, short_logits, log_prior, alpha, 0.3)[:3].tolist() == [30, 0, 17]


def test_empty_batch_launches_nothing(forbid_launch):
    forbid_launch(triton_dels, "_dels_argmax_partial_kernel", "_dels_argmax_merge_kernel")
    empty, log_prior = torch.empty(0, 1000), torch.zeros(1000)
    ids = triton_dels.dels_argmax(empty, empty, log_prior, torch.empty(0), 0.3)
    assert ids.shape == (0,) and ids.dtype == torch.int64


@pytest.mark.parametrize(
    "short_shape, prior_shape, alpha, field",
    [
        ((3, 100), (100,), 0.3, "short_logits"),
        ((2, 100), (99,), 0.3, "log_prior"),
        ((2, 100), (100,), torch.zeros(3), "alpha"),
        ((2, 100), (100,), torch.zeros(2, 1), "alpha"),
        ((2, 100), (100,), True, "alpha"),
    ],
)
def test_bad_input_names_the_field(short_shape, prior_shape, alpha, field):
    long_logits = torch.zeros(2, 100)
    with pytest.raises(ValueError, match=field):
        triton_dels.dels_argmax(long_logits, torch.zeros(short_shape), torch.zeros(prior_shape), alpha, 0.3)
