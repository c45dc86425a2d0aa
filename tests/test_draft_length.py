"""Drafts shorter than k (draft_length.py): the cut marks, the host trim, the option's checks."""

import pytest
import torch

from vllm_liliprop.draft_length import NO_DRAFT, check_draft_length, cut_drafts, trim_rows
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
