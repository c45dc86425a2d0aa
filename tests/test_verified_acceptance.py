"""The comparison of a step's drafts with the tokens the target then verified (plain torch), and
the tracker that pairs a request's drafts with its next step across vLLM's batch reordering."""

import pytest
import torch

from vllm_liliprop.device_tally import DeviceTally
from vllm_liliprop.verified_acceptance import accepted_prefix_lengths, verified_tally

# Three requests, 4 draft slots; the verified continuation is -1 padded past what it revealed.
VERIFIED = torch.tensor([[5, 6, 7, -1, -1],   # 2 drafts accepted, then the target's 7
                         [9, -1, -1, -1, -1],  # none accepted
                         [1, 2, 3, 4, 8]])     # all 4 accepted, bonus 8
RULE = torch.tensor([[5, 6, 0, 0], [3, 3, 3, 3], [1, 2, 3, 4]])


def test_prefix_lengths_stop_at_the_first_difference_and_at_what_was_revealed():
    argmax = torch.tensor([[5, 6, 7, 8], [9, 9, 9, 9], [1, 0, 3, 4]])
    assert accepted_prefix_lengths(RULE, VERIFIED).tolist() == [2, 0, 4]
    # The argmax would have matched 3 on row 0 (capped there: nothing past 7 was revealed), 1
    # on row 1 (the target's own token), and stops at the first difference on row 2.
    assert accepted_prefix_lengths(argmax, VERIFIED).tolist() == [3, 1, 1]


def test_tally_counts_usable_rows_only():
    argmax = torch.tensor([[5, 6, 7, 8], [9, 9, 9, 9], [1, 0, 3, 4]])
    usable = torch.tensor([True, True, False])
    assert verified_tally(RULE, argmax, VERIFIED, usable).tolist() == [2, 2, 4]
    assert verified_tally(RULE, argmax, VERIFIED, torch.ones(3, dtype=torch.bool)).tolist() == [3, 6, 5]


def test_a_row_whose_accepted_tokens_are_not_the_rules_drafts_is_left_out():
    """Row 0 accepted 2 tokens the rule did not draft (a stale draft of a skipped step)."""
    stale = torch.tensor([[4, 4, 4, 4], [9, 0, 0, 0], [1, 2, 3, 4]])
    tally = verified_tally(stale, stale, VERIFIED, torch.ones(3, dtype=torch.bool))
    assert tally.tolist() == [2, 5, 5]


def test_a_row_with_nothing_revealed_is_left_out():
    verified = torch.tensor([[5, -1], [-1, -1]])
    drafts = torch.tensor([[5, 6], [1, 2]])
    assert verified_tally(drafts, drafts, verified, torch.ones(2, dtype=torch.bool)).tolist() == [1, 1, 1]


def test_the_tally_runs_without_host_reads():
    meta = torch.device("meta")
    drafts = torch.empty(3, 7, dtype=torch.long, device=meta)
    tally = verified_tally(drafts, drafts, torch.empty(3, 8, dtype=torch.long, device=meta),
                           torch.empty(3, dtype=torch.bool, device=meta))
    assert tally.shape == (3,) and tally.device == meta


def test_device_tally_sums_what_it_is_given():
    tally = DeviceTally(3)
    assert tally.settled() == (0, 0, 0)
    tally.add(torch.tensor([1, 2, 3]))
    tally.add(torch.tensor([1, 0, 5], dtype=torch.int32))
    assert tally.settled() == tally.total() == (2, 2, 8)


@pytest.mark.vllm
def test_tracker_pairs_each_request_with_its_own_previous_drafts_across_a_reorder():
    from vllm_liliprop.vllm.acceptance_tracker import AcceptanceTracker

    tracker = AcceptanceTracker()
    everyone = torch.ones(3, dtype=torch.bool)
    tracker.verify(torch.tensor([[1], [2], [3]]), everyone, ["a", "b", "c"])  # prefill: nothing yet
    tracker.remember(torch.tensor([[10, 11], [20, 21], [30, 31]]),
                     torch.tensor([[10, 12], [20, 21], [30, 31]]))
    # Next step: "b" finished, "d" is new, "c" moved to row 0; "a" accepted 1, "c" accepted 2.
    sampled = torch.tensor([[30, 31, 7], [10, 13, -1], [4, -1, -1]])
    tracker.verify(sampled, everyone, ["c", "a", "d"])
    # c: rule 2, argmax 2; a: rule 1, argmax 1 (12 != 13); d: no previous draft.
    assert tracker.tally.total() == (2, 3, 3)


@pytest.mark.vllm
def test_tracker_leaves_out_rows_whose_anchor_or_sample_was_discarded():
    from vllm_liliprop.vllm.acceptance_tracker import AcceptanceTracker

    tracker = AcceptanceTracker()
    tracker.verify(torch.tensor([[1], [2]]), torch.tensor([True, False]), ["a", "b"])
    tracker.remember(torch.tensor([[5, 6], [7, 8]]), torch.tensor([[5, 6], [7, 8]]))
    tracker.verify(torch.tensor([[5, 6, 9], [7, 8, 9]]), torch.tensor([True, True]), ["a", "b"])
    tracker.remember(torch.tensor([[1, 1], [2, 2]]), torch.tensor([[1, 1], [2, 2]]))
    tracker.verify(torch.tensor([[1, 3, -1], [2, 2, 4]]), torch.tensor([True, False]), ["a", "b"])
    assert tracker.tally.total() == (2, 3, 3)  # a twice (2 + 1); b never
    tracker.verify(torch.tensor([[1, 1, 3]]), torch.tensor([True]), ["a"])  # none remembered since
    assert tracker.tally.total() == (2, 3, 3)
