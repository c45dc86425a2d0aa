"""Walks over a scored lattice: greedy, exact (Viterbi) and sampled, against brute force."""

import itertools

import pytest
import torch

from vllm_liliprop.walks import greedy_walk, path_score, sampled_walk, viterbi_walk


def random_lattice(bsz, num_slots, k, seed, kind="normal"):
    g = torch.Generator().manual_seed(seed)
    start = torch.randn(bsz, k, generator=g)
    pairs = torch.randn(bsz, num_slots - 1, k, k, generator=g)
    if kind == "integer":  # few distinct values: many exact ties between paths
        start, pairs = start.round().clamp(-1, 1), pairs.round().clamp(-1, 1)
    elif kind == "rounded":  # dyadic values: sums are exact, ties are real
        start, pairs = (start * 2).round() / 2, (pairs * 2).round() / 2
    return start, pairs


def brute_force_best(start, pairs):
    """Lexicographically first path with the maximal score, per request, by enumeration.

    Also returns how many paths attain the maximum in each request.
    """
    num_slots, k = pairs.shape[1] + 1, start.shape[1]
    best_paths, num_maximizers = [], []
    for b in range(start.shape[0]):
        scores = {
            path: float(start[b, path[0]])
            + sum(float(pairs[b, s, path[s], path[s + 1]]) for s in range(num_slots - 1))
            for path in itertools.product(range(k), repeat=num_slots)  # lexicographic order
        }
        best = max(scores.values())
        best_paths.append(next(p for p, v in scores.items() if v == best))
        num_maximizers.append(sum(v == best for v in scores.values()))
    paths = torch.tensor(best_paths, dtype=torch.int64).view(start.shape[0], num_slots)
    return paths, num_maximizers


def reference_greedy(start, pairs):
    paths = []
    for b in range(start.shape[0]):
        scores = start[b].tolist()
        path = []
        for s in range(pairs.shape[1] + 1):
            if s:
                scores = pairs[b, s - 1, path[-1]].tolist()
            path.append(scores.index(max(scores)))  # first maximum
        paths.append(path)
    return torch.tensor(paths, dtype=torch.int64)


@pytest.mark.parametrize("kind", ["normal", "integer", "rounded"])
@pytest.mark.parametrize("num_slots,k", [(1, 1), (1, 4), (2, 2), (3, 3), (4, 4), (5, 2), (5, 3)])
def test_viterbi_matches_brute_force(num_slots, k, kind):
    start, pairs = random_lattice(6, num_slots, k, seed=100 * num_slots + k, kind=kind)
    expected, num_maximizers = brute_force_best(start, pairs)
    got = viterbi_walk(start, pairs)
    assert torch.equal(got, expected)
    assert torch.equal(path_score(start, pairs, got), path_score(start, pairs, expected))
    if kind == "integer" and k**num_slots >= 8:
        assert max(num_maximizers) > 1, "integer lattices must exercise the tie rule"


def test_viterbi_tie_rule_is_lexicographically_smallest():
    # Two optimal paths (0, 1) and (1, 0), both scoring 2: the smaller sequence wins.
    start = torch.tensor([[1.0, 1.0]])
    pairs = torch.tensor([[[[0.0, 1.0], [1.0, 0.0]]]])
    assert viterbi_walk(start, pairs).tolist() == [[0, 1]]
    # All paths tie: all zeros.
    assert viterbi_walk(torch.zeros(2, 3), torch.zeros(2, 3, 3, 3)).tolist() == [[0] * 4] * 2


@pytest.mark.parametrize("kind", ["normal", "integer"])
def test_greedy_matches_reference(kind):
    start, pairs = random_lattice(8, 5, 4, seed=7, kind=kind)
    assert torch.equal(greedy_walk(start, pairs), reference_greedy(start, pairs))


def test_greedy_ties_go_to_lowest_index():
    start = torch.tensor([[0.5, 2.0, 2.0, 1.0]])
    pairs = torch.zeros(1, 2, 4, 4)
    pairs[0, 0, 1] = torch.tensor([0.0, 3.0, 1.0, 3.0])  # from candidate 1: tie 1 vs 3
    pairs[0, 1, 1] = torch.tensor([4.0, 4.0, 4.0, 4.0])  # from candidate 1: all tie
    assert greedy_walk(start, pairs).tolist() == [[1, 1, 0]]


def test_greedy_and_viterbi_disagree_and_viterbi_scores_higher():
    # Greedy takes the slightly better first candidate and is stuck with a poor tail;
    # the exact walk gives up 0.1 at slot 0 to gain 5 at slot 1.
    start = torch.tensor([[1.0, 0.9]])
    pairs = torch.tensor([[[[0.0, 0.0], [0.0, 5.0]]]])
    greedy, exact = greedy_walk(start, pairs), viterbi_walk(start, pairs)
    assert greedy.tolist() == [[0, 0]] and exact.tolist() == [[1, 1]]
    assert path_score(start, pairs, exact).item() == pytest.approx(5.9)
    assert path_score(start, pairs, greedy).item() == pytest.approx(1.0)


def test_viterbi_never_scores_below_greedy():
    start, pairs = random_lattice(64, 6, 8, seed=3)
    g = path_score(start, pairs, greedy_walk(start, pairs))
    v = path_score(start, pairs, viterbi_walk(start, pairs))
    assert (v >= g).all() and (v > g).any()


def test_path_score_matches_manual_sum():
    start, pairs = random_lattice(3, 4, 3, seed=11)
    idx = torch.tensor([[0, 1, 2, 0], [2, 2, 2, 2], [1, 0, 1, 0]])
    for b in range(3):
        manual = start[b, idx[b, 0]].double() + sum(
            pairs[b, s, idx[b, s], idx[b, s + 1]].double() for s in range(3)
        )
        assert path_score(start, pairs, idx)[b].item() == pytest.approx(manual.item(), abs=1e-12)


def test_single_slot_and_empty_batch_shapes():
    start = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 3.0]])
    no_pairs = torch.zeros(2, 0, 3, 3)
    assert greedy_walk(start, no_pairs).tolist() == [[1], [0]]
    assert viterbi_walk(start, no_pairs).tolist() == [[1], [0]]
    idx, probs = sampled_walk(start, no_pairs, torch.tensor([0.0, 1.0]))
    assert idx.shape == (2, 1) and probs.shape == (2, 1, 3)
    assert torch.allclose(probs[1, 0], torch.softmax(start[1], -1))

    empty_start, empty_pairs = torch.zeros(0, 4), torch.zeros(0, 2, 4, 4)
    assert greedy_walk(empty_start, empty_pairs).shape == (0, 3)
    assert viterbi_walk(empty_start, empty_pairs).shape == (0, 3)
    idx, probs = sampled_walk(empty_start, empty_pairs, torch.zeros(0))
    assert idx.shape == (0, 3) and probs.shape == (0, 3, 4) and probs.dtype == torch.float32
    assert path_score(empty_start, empty_pairs, idx).shape == (0,)


def test_sampled_walk_zero_temperature_rows_are_greedy():
    start, pairs = random_lattice(6, 5, 4, seed=5, kind="integer")
    temperature = torch.tensor([0.0, 1.0, 0.0, 0.5, 0.0, 2.0])
    idx, probs = sampled_walk(start, pairs, temperature, torch.Generator().manual_seed(0))
    greedy = greedy_walk(start, pairs)
    rows = temperature == 0
    assert torch.equal(idx[rows], greedy[rows])
    assert torch.equal(probs[rows], torch.nn.functional.one_hot(greedy[rows], 4).float())


def test_sampled_walk_step_probs_are_the_conditional_softmax():
    start, pairs = random_lattice(5, 4, 4, seed=9)
    temperature = torch.tensor([0.5, 1.0, 2.0, 1.0, 0.25])
    idx, probs = sampled_walk(start, pairs, temperature, torch.Generator().manual_seed(1))
    for b in range(5):
        for s in range(4):
            scores = start[b] if s == 0 else pairs[b, s - 1, idx[b, s - 1]]
            expected = torch.softmax(scores / temperature[b], -1)
            assert torch.allclose(probs[b, s], expected, atol=1e-7)
    again = sampled_walk(start, pairs, temperature, torch.Generator().manual_seed(1))
    assert torch.equal(again[0], idx) and torch.equal(again[1], probs)


def test_sampled_walk_empirical_frequencies_match():
    # One lattice repeated over many rows: each draw is an independent sample of the walk.
    start, pairs = random_lattice(1, 3, 3, seed=21)
    n, k = 20000, 3
    start, pairs = start.expand(n, k), pairs.expand(n, 2, k, k)
    temperature = torch.full((n,), 1.5)
    idx, probs = sampled_walk(start, pairs, temperature, torch.Generator().manual_seed(2))

    # Every step: the draws given the previous pick follow the reported distribution.
    for s in range(3):
        if s == 0:
            groups = [torch.ones(n, dtype=torch.bool)]
        else:
            groups = [idx[:, s - 1] == p for p in range(k)]
        for rows in groups:
            if rows.sum() < 1000:
                continue
            freq = torch.bincount(idx[rows, s], minlength=k).float() / rows.sum()
            assert torch.allclose(freq, probs[rows, s][0], atol=0.02)  # ~6 standard errors
            assert torch.equal(probs[rows, s], probs[rows, s][:1].expand(int(rows.sum()), k))

    # Whole paths: frequency of each path against the product of exact conditionals.
    for path in itertools.product(range(k), repeat=3):
        p = torch.softmax(start[0] / 1.5, -1)[path[0]]
        for s in range(2):
            p = p * torch.softmax(pairs[0, s, path[s]] / 1.5, -1)[path[s + 1]]
        freq = (idx == torch.tensor(path)).all(dim=1).float().mean()
        assert abs(freq.item() - p.item()) < 0.015


def test_non_finite_scores_do_not_crash():
    start = torch.tensor([[0.0, float("nan"), 1.0], [float("-inf")] * 3, [0.0, float("inf"), 1.0]])
    pairs = torch.zeros(3, 2, 3, 3)
    pairs[0, 0, 1, 2] = float("nan")
    for walk in (greedy_walk, viterbi_walk):
        idx = walk(start, pairs)
        assert idx.shape == (3, 3) and ((idx >= 0) & (idx < 3)).all()
    idx, probs = sampled_walk(start, pairs, torch.ones(3), torch.Generator().manual_seed(0))
    assert ((idx >= 0) & (idx < 3)).all()
    # Non-finite softmax falls back to the greedy pick with a one-hot distribution.
    assert probs[0, 0].tolist() == [0.0, 1.0, 0.0] and probs[1, 0].tolist() == [1.0, 0.0, 0.0]
    assert probs[2, 0].tolist() == [0.0, 1.0, 0.0]
    assert torch.isfinite(probs).all()


def test_shape_errors_name_the_argument():
    with pytest.raises(ValueError, match="pairs"):
        greedy_walk(torch.zeros(2, 3), torch.zeros(2, 1, 3, 4))
    with pytest.raises(ValueError, match="start"):
        viterbi_walk(torch.zeros(2, 3, 1), torch.zeros(2, 1, 3, 3))
    with pytest.raises(ValueError, match="temperature"):
        sampled_walk(torch.zeros(2, 3), torch.zeros(2, 1, 3, 3), torch.zeros(3))
    with pytest.raises(ValueError, match="idx"):
        path_score(torch.zeros(2, 3), torch.zeros(2, 1, 3, 3), torch.zeros(2, 3, dtype=torch.long))
