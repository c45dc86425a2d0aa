"""The hybrid rule (option `prompt_lookup`) in real vLLM engines: the proposer rebuilds each
request's tokens exactly (the counters of a known policy are predicted to the token), greedy
output is plain decoding's, and the trained tiny drafter gains from it where text repeats."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import AutoTokenizer

from tests.engine import PROMPTS, counters_list, generate, plain32, predict_counters
from vllm_liliprop.prompt_lookup import lookup_continuation

pytestmark = pytest.mark.vllm
K = 7
LENGTHS = (2, 3)


def _hybrid_policy(prompt_ids):
    """Lookup over prompt + output so far; else the inner test rule (repeat the last token)."""
    def draft(ys, p):
        history = np.array(list(prompt_ids) + list(ys[: p + 1]), dtype=np.int64)
        found = lookup_continuation(history, *LENGTHS, K)
        return [ys[p]] * K if found is None else found.tolist()
    return draft


def test_the_hybrid_counters_are_predicted_to_the_token(tiny_models, stock):
    plain = stock["plain"]["ids"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["target"])
    prompt_ids = [tokenizer(p).input_ids for p in PROMPTS]
    options = {"rule": "tests.policies:repeat_anchor", "prompt_lookup": list(LENGTHS)}
    ids, counters, drafter = generate(tiny_models["target"], tiny_models["draft"], options=options)
    assert ids == plain32(stock)
    predicted = [predict_counters([ys], _hybrid_policy(pids), K) for ys, pids in zip(plain, prompt_ids)]
    summed = [sum(p[0] for p in predicted), sum(p[1] for p in predicted), sum(p[2] for p in predicted),
              [sum(p[3][i] for p in predicted) for i in range(K)]]
    assert counters_list(counters) == summed
    assert drafter.num_lookup_rows > 0
    # The lookup changed the drafts: the inner rule alone accepts less.
    alone = [predict_counters([ys], lambda ys, p: [ys[p]] * K, K) for ys in plain]
    assert counters.num_accepted_tokens > sum(p[2] for p in alone)


def test_greedy_output_with_the_trained_drafter_is_plain_decoding(tiny_models, stock):
    options = {"rule": "argmax", "prompt_lookup": [3, 5]}
    ids, counters, drafter = generate(tiny_models["target"], tiny_models["draft"], options=options)
    assert ids == plain32(stock)
    assert counters.num_drafts > 0 and drafter.num_lookup_rows > 0


def test_a_failing_lookup_turns_itself_off_without_changing_the_output(tiny_models, stock):
    def break_lookup(drafter):
        drafter._lookup_lengths = ("not", "lengths")  # lookup_drafts raises on these
    ids, counters, drafter = generate(tiny_models["target"], tiny_models["draft"],
                                      options={"rule": "argmax", "prompt_lookup": [3, 5]},
                                      prepare=break_lookup)
    assert ids == plain32(stock)
    assert drafter._lookup_lengths is None and drafter.num_lookup_rows == 0


def test_a_cut_rule_block_beside_long_lookups_is_predicted_to_the_token(tiny_models, stock):
    """rule_draft_length = 2 with k = 7: the inner rule's rows draft 2 tokens, the lookup's 7,
    and vLLM schedules and verifies exactly those (draft_length.py, patching.py 10)."""
    plain = stock["plain"]["ids"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["target"])
    prompt_ids = [tokenizer(p).input_ids for p in PROMPTS]
    options = {"rule": "tests.policies:repeat_anchor", "prompt_lookup": list(LENGTHS),
               "rule_draft_length": 2}
    ids, counters, drafter = generate(tiny_models["target"], tiny_models["draft"], options=options)
    assert ids == plain32(stock)

    def cut_policy(pids):
        hybrid = _hybrid_policy(pids)

        def draft(ys, p):
            history = np.array(list(pids) + list(ys[: p + 1]), dtype=np.int64)
            found = lookup_continuation(history, *LENGTHS, K) is not None
            return hybrid(ys, p) if found else hybrid(ys, p)[:2]
        return draft

    predicted = [predict_counters([ys], cut_policy(pids), K) for ys, pids in zip(plain, prompt_ids)]
    summed = [sum(p[0] for p in predicted), sum(p[1] for p in predicted), sum(p[2] for p in predicted),
              [sum(p[3][i] for p in predicted) for i in range(K)]]
    assert counters_list(counters) == summed
    assert counters.num_draft_tokens < K * counters.num_drafts  # some drafts were cut
    assert drafter.num_lookup_rows > 0


def test_rule_draft_length_zero_drafts_only_where_the_lookup_matches(tiny_models, stock):
    options = {"rule": "argmax", "prompt_lookup": [3, 5], "rule_draft_length": 0}
    ids, counters, drafter = generate(tiny_models["target"], tiny_models["draft"], options=options)
    assert ids == plain32(stock)
    # Only lookup rows draft, whole (a request's last draft is never verified).
    assert 0 < counters.num_drafts <= drafter.num_lookup_rows
    assert counters.num_draft_tokens == K * counters.num_drafts


def test_a_rule_draft_length_that_cuts_nothing_is_refused_at_engine_start(tiny_models):
    with pytest.raises(Exception, match=r"rule_draft_length = 7 keeps every one of the "
                                        r"num_speculative_tokens = 7"):
        generate(tiny_models["target"], tiny_models["draft"],
                 options={"rule": "argmax", "prompt_lookup": [3, 5], "rule_draft_length": 7})
