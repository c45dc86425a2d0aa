"""Prompt lookup, the hybrid rule's other source (vllm_liliprop/prompt_lookup.py), on cases with
known answers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_liliprop.options import OptionError, resolve_options
from vllm_liliprop.prompt_lookup import lookup_continuation, lookup_drafts
from vllm_liliprop.rules.fallback import replace_rows


def _look(tokens, min_n=2, max_n=4, k=3):
    out = lookup_continuation(np.array(tokens, dtype=np.int64), min_n, max_n, k)
    return None if out is None else out.tolist()


def test_the_longest_suffix_wins_at_its_latest_earlier_occurrence():
    # Suffix [1, 2] occurs at 0 (followed by 9) and at 4 (followed by 7); [5, 1, 2] only at 3
    # (followed by 7 8 9): the longest match decides, then the latest of its occurrences.
    assert _look([1, 2, 9, 5, 1, 2, 7, 8, 9, 6, 5, 1, 2]) == [7, 8, 9]
    assert _look([1, 2, 9, 3, 1, 2, 7, 4, 1, 2], max_n=2) == [7, 4, 1]


def test_a_repeat_shorter_than_the_block_continues_itself():
    # The history loops with period 2: the copy runs on into its own continuation.
    assert _look([4, 5, 6, 7, 6, 7, 6, 7], min_n=2, max_n=2, k=5) == [6, 7, 6, 7, 6]


def test_nothing_when_no_suffix_recurs_or_the_history_is_short():
    assert _look([1, 2, 3, 4, 5, 6]) is None
    assert _look([1, 2, 1], min_n=2) is None  # [2, 1] has no earlier occurrence
    assert _look([7], min_n=1) is None and _look([], min_n=1) is None
    assert _look([7, 7], min_n=1, k=2) == [7, 7]


def test_a_batch_marks_rows_found_and_only_those_rows_are_replaced():
    ids, found = lookup_drafts([np.array([1, 2, 3, 1, 2]), None, np.array([5, 6])], 2, 2, 2)
    assert found.tolist() == [True, False, False] and ids[0].tolist() == [3, 1]
    drafts = torch.full((3, 2), 9)
    probs = torch.full((3, 2, 4), 0.25)
    out, out_probs = replace_rows(drafts, probs, found, ids)
    assert out.tolist() == [[3, 1], [9, 9], [9, 9]]
    assert out_probs[0, 0].tolist() == [0, 0, 0, 1] and out_probs[0, 1].tolist() == [0, 1, 0, 0]
    assert torch.equal(out_probs[1:], probs[1:])


@pytest.mark.parametrize("bad", [[3], [0, 2], [4, 3], [2, 65], ["3", 5], [True, 2], 3])
def test_bad_lookup_lengths_name_the_field(bad):
    with pytest.raises(OptionError, match=r"VLLM_LILIPROP_OPTIONS\.prompt_lookup .*min_n"):
        resolve_options(None, {}, environ={"VLLM_LILIPROP_OPTIONS": f'{{"prompt_lookup": {_json(bad)}}}'})


def test_lookup_lengths_are_an_option():
    options = resolve_options(None, {"liliprop": {"prompt_lookup": [3, 5]}})
    assert options.prompt_lookup == (3, 5) and options.rule == "argmax"


def _json(value):
    import json

    return json.dumps(value)
