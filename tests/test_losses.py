"""Hand-computed checks of training/losses.py (Eq. 2-7 and 13 of the LiLiCorr paper)."""

import math

import pytest
import torch

from training.losses import (
    LossWeights,
    distractor_penalty,
    dflash_ce,
    ground_truth_index,
    margin_hinge,
    oracle_prefix_mask,
    reranker_ce,
    total_loss,
)

# One block, three drafted slots, two candidates per slot.
CANDIDATES = torch.tensor([[[5, 6], [7, 8], [9, 10]]])


def lattice_scores():
    """start = [0, ln 3] (P = 1/4, 3/4); slot 0 -> 1 rows: gt row 1 = [0, 0], row 0 = [5, -5]."""
    start = torch.tensor([[0.0, math.log(3.0)]], requires_grad=True)
    pairs = torch.zeros(1, 2, 2, 2)
    pairs[0, 0, 0] = torch.tensor([5.0, -5.0])  # must never be read: slot 0's truth is index 1
    pairs[0, 1] = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    return start, pairs.requires_grad_()


def test_oracle_prefix_stops_at_first_miss():
    targets = torch.tensor([[6, 1, 10]])  # slot 1 misses, slot 2 would be covered
    assert oracle_prefix_mask(CANDIDATES, targets).tolist() == [[True, False, False]]
    assert ground_truth_index(CANDIDATES, targets).tolist() == [[1, -1, 1]]
    full = torch.tensor([[6, 8, 9]])
    assert oracle_prefix_mask(CANDIDATES, full).tolist() == [[True, True, True]]
    unsupervised = torch.tensor([[6, -1, 9]])  # a negative target ends the prefix too
    assert oracle_prefix_mask(CANDIDATES, unsupervised).tolist() == [[True, False, False]]


def test_reranker_ce_is_teacher_forced_on_ground_truth_predecessor():
    start, pairs = lattice_scores()
    targets = torch.tensor([[6, 8, 11]])
    mask = oracle_prefix_mask(CANDIDATES, targets)
    gt = ground_truth_index(CANDIDATES, targets)
    assert mask.tolist() == [[True, True, False]]
    loss = reranker_ce(start, pairs, gt, mask)
    expected = (math.log(4 / 3) + math.log(2.0)) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss.backward()
    # Row 0 of the first pair matrix belongs to a non-ground-truth predecessor.
    assert torch.all(pairs.grad[0, 0, 0] == 0)
    assert torch.all(pairs.grad[0, 1] == 0)  # slot 2 is outside the oracle prefix
    assert pairs.grad[0, 0, 1].abs().sum() > 0


def test_block_whose_first_slot_misses_contributes_zero():
    start, pairs = lattice_scores()
    targets = torch.tensor([[1, 8, 9]])
    mask = oracle_prefix_mask(CANDIDATES, targets)
    assert not mask.any()
    gt = ground_truth_index(CANDIDATES, targets)
    logq = torch.zeros(1, 3, 2)
    for loss in (
        reranker_ce(start, pairs, gt, mask),
        distractor_penalty(start, pairs, gt, logq, mask),
        margin_hinge(start, pairs, gt, mask, 2.0),
    ):
        assert loss.item() == 0.0
        assert loss.requires_grad


def test_reranker_average_is_over_slots_of_the_batch():
    start, pairs = lattice_scores()
    # Second block: slot 0 misses, so it adds no slot and no loss to the mean.
    start2 = torch.cat([start, torch.tensor([[7.0, 7.0]])])
    pairs2 = torch.cat([pairs, torch.zeros(1, 2, 2, 2)])
    candidates = torch.cat([CANDIDATES, CANDIDATES])
    targets = torch.tensor([[6, 8, 11], [1, 8, 9]])
    mask = oracle_prefix_mask(candidates, targets)
    loss = reranker_ce(start2, pairs2, ground_truth_index(candidates, targets), mask)
    assert loss.item() == pytest.approx((math.log(4 / 3) + math.log(2.0)) / 2, rel=1e-6)


def test_distractor_rectifier_active_and_inactive():
    start, pairs = lattice_scores()
    targets = torch.tensor([[6, 8, 11]])
    mask = oracle_prefix_mask(CANDIDATES, targets)
    gt = ground_truth_index(CANDIDATES, targets)
    logq = torch.log(torch.tensor([[[0.1, 0.5], [0.6, 0.2], [0.5, 0.5]]]))
    # Slot 0: the truth (q = .5) beats candidate 0 (q = .1): cost log 5 weighted by P = 1/4.
    # Slot 1: the target prefers candidate 0 (q = .6) over the truth (q = .2): the negative
    # cost is clipped to zero, so the slot contributes nothing.
    loss = distractor_penalty(start, pairs, gt, logq, mask)
    assert loss.item() == pytest.approx((0.25 * math.log(5.0) + 0.0) / 2, rel=1e-6)

    # Inactive rectifier: truth is the target's top everywhere, so the penalty equals the
    # expected cost H(P, q) minus the truth's cost (Appendix D, Eq. 9).
    logq = torch.log(torch.tensor([[[0.1, 0.5], [0.3, 0.6], [0.5, 0.5]]]))
    loss = distractor_penalty(start, pairs, gt, logq, mask)
    slot0 = 0.25 * (-math.log(0.1)) + 0.75 * (-math.log(0.5)) - (-math.log(0.5))
    slot1 = 0.5 * (-math.log(0.3)) + 0.5 * (-math.log(0.6)) - (-math.log(0.6))
    assert loss.item() == pytest.approx((slot0 + slot1) / 2, rel=1e-6)


def test_margin_hinge_active_below_and_inactive_above_the_margin():
    start, pairs = lattice_scores()
    targets = torch.tensor([[6, 8, 11]])
    mask = oracle_prefix_mask(CANDIDATES, targets)
    gt = ground_truth_index(CANDIDATES, targets)
    # Slot 0 gap ln 3, slot 1 gap 0; rho = 2.
    loss = margin_hinge(start, pairs, gt, mask, rho=2.0)
    assert loss.item() == pytest.approx(((2 - math.log(3.0)) + 2.0) / 2, rel=1e-6)

    wide_start = torch.tensor([[0.0, 5.0]], requires_grad=True)
    wide_pairs = pairs.detach().clone()
    wide_pairs[0, 0, 1] = torch.tensor([-1.0, 3.0])  # gaps 5 and 4, both above rho = 2
    wide_pairs.requires_grad_()
    loss = margin_hinge(wide_start, wide_pairs, gt, mask, rho=2.0)
    assert loss.item() == 0.0
    loss.backward()
    assert wide_start.grad.abs().sum() == 0 and wide_pairs.grad.abs().sum() == 0


def test_dflash_ce_decay_weighted_mean():
    logits = torch.zeros(1, 3, 4)
    logits[0, 1, 0] = math.log(3.0)  # p(target 0) = 3 / 6
    logits[0, 2] = torch.tensor([9.0, 0.0, 0.0, 0.0])  # masked out
    targets = torch.tensor([[2, 0, 3]])
    mask = torch.tensor([[True, True, False]])
    loss = dflash_ce(logits, targets, decay=2.0, mask=mask)
    w1 = math.exp(-0.5)
    assert loss.item() == pytest.approx((math.log(4.0) + w1 * math.log(2.0)) / (1 + w1), rel=1e-6)


def test_dflash_normalize_blocks_is_eq6_as_written():
    """"blocks": each block's unnormalised sum of w_s CE_s, averaged over the blocks that
    supervise a slot (a block with none counts for nothing); "weight": the weighted slot mean."""
    logits = torch.zeros(3, 3, 4)
    logits[0, 1, 0] = math.log(3.0)
    targets = torch.tensor([[2, 0, 3], [1, 1, 1], [0, 0, 0]])
    mask = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])
    w1 = math.exp(-0.5)
    block_sums = [math.log(4.0) + w1 * math.log(2.0), math.log(4.0)]
    terms = total_loss(draft_logits=logits, targets=targets, slot_mask=mask,
                       weights=LossWeights(dflash_decay=2.0, dflash_normalize="blocks"))
    assert terms["dflash"].item() == pytest.approx(sum(block_sums) / 2, rel=1e-6)
    assert terms["dflash_weight"].item() == 2
    mean = total_loss(draft_logits=logits, targets=targets, slot_mask=mask,
                      weights=LossWeights(dflash_decay=2.0))
    assert mean["dflash"].item() == pytest.approx(sum(block_sums) / (2 + w1), rel=1e-6)
    with pytest.raises(ValueError, match="dflash_normalize"):
        LossWeights(dflash_normalize="slots")


def test_total_loss_combines_terms_as_eq7_and_margin_variant():
    start, pairs = lattice_scores()
    targets = torch.tensor([[6, 8, 11]])
    slot_mask = torch.ones(1, 3, dtype=torch.bool)
    logits = torch.randn(1, 3, 16, generator=torch.Generator().manual_seed(0))
    logq = torch.log(torch.tensor([[[0.1, 0.5], [0.6, 0.2], [0.5, 0.5]]]))
    kwargs = dict(
        draft_logits=logits, targets=targets, slot_mask=slot_mask, candidate_ids=CANDIDATES,
        start=start, pairs=pairs, target_logq=logq,
    )
    plain = total_loss(weights=LossWeights(), **kwargs)
    expected = plain["dflash"] + 0.25 * (plain["ce"] + 1.0 * plain["distractor"])
    assert plain["loss"].item() == pytest.approx(expected.item(), rel=1e-6)
    assert plain["oracle_slots"].item() == 2

    margin = total_loss(weights=LossWeights.with_margin(), **kwargs)
    expected = margin["dflash"] + 0.25 * (
        0.5 * margin["ce"] + margin["distractor"] + 0.5 * margin["margin"]
    )
    assert margin["loss"].item() == pytest.approx(expected.item(), rel=1e-6)
    assert margin["margin"].item() == pytest.approx(((2 - math.log(3.0)) + 2.0) / 2, rel=1e-6)

    # A slot outside slot_mask is excluded from the oracle prefix as well.
    cut = total_loss(weights=LossWeights(), **{**kwargs, "slot_mask": torch.tensor([[True, False, True]])})
    assert cut["oracle_slots"].item() == 1


def test_bad_inputs_raise_value_error_naming_the_field():
    start, pairs = lattice_scores()
    gt = torch.tensor([[1, -1, 0]])
    with pytest.raises(ValueError, match="predecessor"):
        reranker_ce(start, pairs, gt, torch.tensor([[True, False, True]]))
    with pytest.raises(ValueError, match="mask"):
        reranker_ce(start, pairs, gt, torch.ones(1, 3))
    with pytest.raises(ValueError, match="pairs"):
        reranker_ce(start, pairs[:, :1], gt, torch.ones(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="decay"):
        dflash_ce(torch.zeros(1, 3, 4), torch.zeros(1, 3, dtype=torch.long), 0.0, torch.ones(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="margin_blend"):
        LossWeights(margin_blend=1.5)
    with pytest.raises(ValueError, match="target_logq"):
        total_loss(
            draft_logits=torch.zeros(1, 3, 16), targets=torch.tensor([[6, 8, 9]]),
            slot_mask=torch.ones(1, 3, dtype=torch.bool), candidate_ids=CANDIDATES,
            start=start, pairs=pairs,
        )
