"""Drafts shorter than k (draft_length.py): the cut marks, the host trim, the option's checks."""

import pytest
import torch

from vllm_liliprop.draft_length import (NO_DRAFT, check_confidence_floor, check_draft_length, confident_cut,
                                        cut_drafts, kept_length, pad_drafts, queried_masks, rule_slots,
                                        short_block_advice, trim_rows)
from vllm_liliprop.options import OptionError, resolve_options


def test_cut_drafts_marks_the_slots_past_the_length_except_in_kept_rows():
    ids = torch.arange(12).reshape(3, 4)
    out = cut_drafts(ids, 1, keep=torch.tensor([False, True, False]))
    assert out.tolist() == [[0, NO_DRAFT, NO_DRAFT, NO_DRAFT], [4, 5, 6, 7],
                            [8, NO_DRAFT, NO_DRAFT, NO_DRAFT]]
    assert cut_drafts(ids, 0).eq(NO_DRAFT).all()
    assert cut_drafts(ids, 4) is ids


def test_trim_rows_cuts_each_host_row_at_its_first_mark():
    rows = [[5, 6, NO_DRAFT, NO_DRAFT], [1, 2, 3], [NO_DRAFT, NO_DRAFT], []]
    assert trim_rows(rows) == [[5, 6], [1, 2, 3], [], []]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3", None])
def test_a_bad_length_names_the_field(bad):
    with pytest.raises(ValueError, match="where = .* must be an integer >= 0"):
        check_draft_length(bad, "where")


def test_the_option_is_checked_where_it_is_read():
    block = {"liliprop": {"rule": "argmax", "rule_draft_length": -2}}
    with pytest.raises(OptionError, match=r"dflash_config.liliprop.rule_draft_length = -2"):
        resolve_options(["DFlashDraftModel"], block, environ={})
    options = resolve_options(["DFlashDraftModel"], {"liliprop": {"rule_draft_length": 3}},
                              environ={})
    assert options.rule_draft_length == 3


def test_the_rule_drafts_only_the_slots_kept_and_is_padded_back():
    assert rule_slots(7, None) == 7 and rule_slots(7, 3) == 3 and rule_slots(2, 3) == 2
    assert rule_slots(7, 0) == 1  # a head needs a slot; length 0 is cut whole afterwards
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    probs = torch.rand(2, 3, 11)
    wide, wide_probs = pad_drafts(ids, probs, 5)
    assert wide.tolist() == [[5, 6, 7, NO_DRAFT, NO_DRAFT], [8, 9, 10, NO_DRAFT, NO_DRAFT]]
    assert wide_probs.shape == (2, 5, 11)
    assert torch.equal(wide_probs[:, :3], probs) and not wide_probs[:, 3:].any()
    assert pad_drafts(ids, None, 3) == (ids, None)
    assert trim_rows(wide.tolist()) == ids.tolist()


def test_a_block_shorter_than_trained_is_explained_with_the_setting_that_fixes_it():
    advice = short_block_advice(8, 3, None)
    assert "num_speculative_tokens = 7 with liliprop rule_draft_length = 3" in advice
    assert short_block_advice(8, 7, None) is None  # the trained block
    assert short_block_advice(8, 7, 3) is None
    assert "num_speculative_tokens = 7 with liliprop rule_draft_length = 2" in short_block_advice(8, 3, 2)
    assert short_block_advice(8, 0, None) is None  # k = 0: plain decoding


def test_a_scheduled_k_queries_the_trained_block_and_keeps_only_what_is_verified():
    # block 8, configured k 7: any k > 0 queries the 7 masks; k 0 queries nothing
    assert [queried_masks(k, 7, 8) for k in range(8)] == [0, 7, 7, 7, 7, 7, 7, 7]
    assert queried_masks(3, 3, 8) == 3  # vLLM sized its buffers for 3 queries: no more
    assert queried_masks(11, 11, 8) == 11 and queried_masks(2, 7, 0) == 2
    assert kept_length(None, 7, 7) is None  # the whole block verified
    assert kept_length(3, 7, 7) == 3 and kept_length(3, 2, 7) == 2 and kept_length(None, 2, 7) == 2
    assert kept_length(0, 5, 7) == 0


def test_the_confidence_cut_ends_greedy_rows_where_the_product_falls_below_the_floor():
    ids = torch.arange(8).reshape(2, 4)
    confidence = torch.tensor([[0.9, 0.5, 0.9, 0.9], [0.2, 1.0, 1.0, 1.0]])
    out = confident_cut(ids, confidence, 0.4, temperature=None)
    assert out.tolist() == [[0, 1, 2, NO_DRAFT], [NO_DRAFT] * 4]  # products .9 .45 .405 .3645; .2
    # A sampled row (temperature > 0) is never cut; a NaN confidence cuts nothing.
    out = confident_cut(ids, confidence, 0.4, temperature=torch.tensor([0.0, 1.0]))
    assert out.tolist() == [[0, 1, 2, NO_DRAFT], [4, 5, 6, 7]]
    nan = torch.full((2, 4), float("nan"))
    assert torch.equal(confident_cut(ids, nan, 0.3, temperature=None), ids)


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1, True, "0.1", None])
def test_a_bad_confidence_floor_names_the_field(bad):
    with pytest.raises(ValueError, match="where = .* must be a number between 0 and 1"):
        check_confidence_floor(bad, "where")


def test_the_confidence_floor_is_checked_where_it_is_read_and_serves_every_built_in_rule():
    with pytest.raises(OptionError, match=r"dflash_config.liliprop.draft_confidence_floor = 2"):
        resolve_options(["DFlashDraftModel"], {"liliprop": {"draft_confidence_floor": 2}}, environ={})
    options = resolve_options(["DFlashDraftModel"], {"liliprop": {"draft_confidence_floor": 0.06}},
                              environ={})
    assert options.draft_confidence_floor == 0.06
    options = resolve_options(["DFlashDraftModel"], {"liliprop": {"rule": "domino",
                                                                  "draft_confidence_floor": 0.1}},
                              environ={})
    assert (options.rule, options.draft_confidence_floor) == ("domino", 0.1)


def test_the_drafters_probability_of_its_draft_is_its_softmax_at_the_drafted_token():
    from vllm_liliprop.rules.base import drafted_probability

    logits = torch.randn(2, 3, 11)
    ids = torch.randint(0, 11, (2, 3))
    expected = logits.softmax(-1).gather(-1, ids[..., None])[..., 0]
    assert torch.allclose(drafted_probability(logits, ids), expected, atol=1e-6)

