"""Triton lattice walks vs vllm_liliprop.walks (interpreted)."""

import pytest
import torch

pytest.importorskip("triton")

from vllm_liliprop import walks  # noqa: E402
from vllm_liliprop.kernels import triton_walks  # noqa: E402

NAN, INF = float("nan"), float("inf")
nonfinite = pytest.mark.filterwarnings("ignore::RuntimeWarning")
SHAPES = [(1, 15, 16), (64, 15, 16), (64, 1, 16), (64, 15, 1), (1, 1, 1), (64, 15, 8)]


def _lattice(batch, num_slots, k, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, k, generator=generator), torch.randn(batch, num_slots - 1, k, k, generator=generator)


def _tied_lattice(batch, num_slots, k, seed):
    """Scores in {-inf, -1, 0, 1}: most rows hold exact ties, Viterbi has many tied paths."""
    generator = torch.Generator().manual_seed(seed)
    start = torch.randint(-1, 2, (batch, k), generator=generator).float()
    pairs = torch.randint(-2, 2, (batch, num_slots - 1, k, k), generator=generator).float()
    pairs[pairs == -2] = -INF
    return start, pairs


WALKS = [
    (triton_walks.greedy_walk, walks.greedy_walk),
    (triton_walks.viterbi_walk, walks.viterbi_walk),
]
WALK_IDS = ["greedy", "viterbi"]


@pytest.mark.parametrize("kernel, torch_walk", WALKS, ids=WALK_IDS)
@pytest.mark.parametrize("batch, num_slots, k", SHAPES)
def test_walk_matches_reference(kernel, torch_walk, batch, num_slots, k):
    start, pairs = _lattice(batch, num_slots, k, seed=batch * 100 + num_slots * 10 + k)
    path = kernel(start, pairs, rows_per_program=64)
    assert path.dtype == torch.int64 and path.shape == (batch, num_slots)
    assert torch.equal(path, torch_walk(start, pairs))


@pytest.mark.parametrize("kernel, torch_walk", WALKS, ids=WALK_IDS)
def test_walk_default_launch_with_a_partial_last_program(kernel, torch_walk):
    start, pairs = _lattice(13, 15, 16, seed=13)
    assert torch.equal(kernel(start, pairs), torch_walk(start, pairs))
    assert torch.equal(kernel(start, pairs, rows_per_program=2), torch_walk(start, pairs))


@pytest.mark.parametrize("kernel, torch_walk", WALKS, ids=WALK_IDS)
@pytest.mark.parametrize("batch, num_slots, k", [(64, 15, 16), (64, 15, 3), (7, 6, 4)])
def test_walk_ties_and_negative_infinity(kernel, torch_walk, batch, num_slots, k):
    start, pairs = _tied_lattice(batch, num_slots, k, seed=k)
    start[0] = -INF  # a start row of -inf only: ties everywhere, index 0 wins
    pairs[1] = -INF
    assert torch.equal(kernel(start, pairs, rows_per_program=64), torch_walk(start, pairs))


@nonfinite
@pytest.mark.parametrize("kernel, torch_walk", WALKS, ids=WALK_IDS)
def test_walk_nan_follows_torch_argmax(kernel, torch_walk):
    start, pairs = _tied_lattice(16, 15, 8, seed=3)
    start[0, 5] = NAN  # NaN outranks everything at slot 0
    pairs[1, :, :, 6] = -NAN  # sign bit set (as inf - inf makes it): still above every number
    pairs[2, 7] = NAN  # a fully NaN step
    pairs[3, 3, 2, [1, 4]] = NAN  # NaNs on a single row, lowest one wins when visited
    start[4] = NAN
    path = kernel(start, pairs, rows_per_program=16)
    assert torch.equal(path, torch_walk(start, pairs))
    assert path[0, 0] == 5


@pytest.mark.parametrize("kernel, torch_walk", WALKS, ids=WALK_IDS)
def test_walk_reads_low_precision_and_strided_scores(kernel, torch_walk):
    start, pairs = _lattice(8, 15, 8, seed=4)
    start, pairs = start.bfloat16(), pairs.bfloat16()
    assert torch.equal(kernel(start, pairs, rows_per_program=8), torch_walk(start, pairs))
    transposed = pairs.transpose(2, 3)  # a non-contiguous view, read through its strides
    assert torch.equal(kernel(start, transposed, rows_per_program=8), torch_walk(start, transposed))
    assert torch.equal(kernel(start[:, :4], pairs[:, :, :4, :4]), torch_walk(start[:, :4], pairs[:, :, :4, :4]))


def test_viterbi_path_is_at_least_as_good_as_greedy():
    start, pairs = _lattice(64, 15, 8, seed=5)
    greedy = triton_walks.greedy_walk(start, pairs, rows_per_program=64)
    viterbi = triton_walks.viterbi_walk(start, pairs, rows_per_program=64)
    gain = walks.path_score(start, pairs, viterbi) - walks.path_score(start, pairs, greedy)
    assert (gain >= 0).all() and (gain > 0).any()


def test_empty_batch_launches_nothing(forbid_launch):
    forbid_launch(triton_walks, "_greedy_walk_kernel", "_viterbi_walk_kernel")
    start, pairs = torch.empty(0, 8), torch.empty(0, 14, 8, 8)
    for kernel in (triton_walks.greedy_walk, triton_walks.viterbi_walk):
        path = kernel(start, pairs)
        assert path.shape == (0, 15) and path.dtype == torch.int64


@pytest.mark.parametrize(
    "start, pairs, field",
    [
        (torch.zeros(2, 4), torch.zeros(3, 5, 4, 4), "pairs"),
        (torch.zeros(2, 4), torch.zeros(2, 5, 4, 3), "pairs"),
        (torch.zeros(2, 4, 1), torch.zeros(2, 5, 4, 4), "start"),
        (torch.zeros(2, 4), torch.zeros(2, 5, 4, 4, dtype=torch.int64), "pairs"),
    ],
)
def test_bad_lattice_names_the_field(start, pairs, field):
    for kernel in (triton_walks.greedy_walk, triton_walks.viterbi_walk):
        with pytest.raises(ValueError, match=field):
            kernel(start, pairs)


def test_bad_rows_per_program_is_refused():
    start, pairs = torch.zeros(2, 4), torch.zeros(2, 5, 4, 4)
    with pytest.raises(ValueError, match="rows_per_program"):
        triton_walks.greedy_walk(start, pairs, rows_per_program=3)


def test_viterbi_refuses_lattices_beyond_its_register_table():
    assert triton_walks.viterbi_fits(num_slots=16, k=16)
    assert not triton_walks.viterbi_fits(num_slots=300, k=16)
    with pytest.raises(ValueError, match="vllm_liliprop.walks.viterbi_walk"):
        triton_walks.viterbi_walk(torch.zeros(1, 16), torch.zeros(1, 299, 16, 16))
