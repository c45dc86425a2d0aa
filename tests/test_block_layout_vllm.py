"""The drafter's block layout in real vLLM engines: vLLM's DFlash path queries [anchor, mask x k],
so k = 3 gives a block-8 drafter a block of 4 it was never trained on. Served at k = 7 with
`rule_draft_length = 3`, the drafter queries its whole trained block while the rule drafts, and the
target verifies, only the first 3 slots (docs/serving.md, "The drafter's block")."""

from __future__ import annotations

import pytest
import torch

from tests.engine import generate, plain32, recording

pytestmark = pytest.mark.vllm


def _served(tiny_models, k, options):
    """(output ids, counters, what the rule saw at each draft step) of one greedy engine."""
    records = []
    ids, counters, _ = generate(tiny_models["target"], tiny_models["draft"], num_spec=k,
                                options=options, prepare=recording(records))
    return ids, counters, records


def test_a_cut_block_keeps_the_trained_layout_and_verifies_only_the_kept_slots(tiny_models, stock):
    ids, counters, cut = _served(tiny_models, 7, {"rule": "argmax", "rule_draft_length": 3})
    assert ids == plain32(stock)
    # The rule saw, and vLLM verified, 3 slots a draft.
    assert {tuple(step["hidden"].shape[1:2]) for step in cut} == {(3,)}
    assert counters.num_draft_tokens == 3 * counters.num_drafts > 0
    assert all(v == 0 for v in counters.accepted_per_pos[3:])

    _, _, whole = _served(tiny_models, 7, {"rule": "argmax"})
    _, _, short = _served(tiny_models, 3, {"rule": "argmax"})
    # First draft step: every engine has the same context. The kept slots are the whole
    # block's first 3 (same queries, same attention); the block of 4 is another computation.
    first_cut, first_whole, first_short = cut[0]["hidden"], whole[0]["hidden"][:, :3], short[0]["hidden"]
    assert first_cut.shape == first_whole.shape == first_short.shape
    torch.testing.assert_close(first_cut, first_whole)
    assert not torch.allclose(first_cut, first_short, atol=1e-3)


def test_a_schedule_that_verifies_fewer_slots_still_queries_the_trained_block(tiny_models, stock):
    """A speculation schedule picks k per batch size; at k = 2 below the configured 7 the drafter
    still queries its block of 8 (draft_length.queried_masks) and vLLM verifies 2."""
    records, queried = [], []

    def prepare(drafter):
        recording(records)(drafter)
        first_pass = drafter.set_inputs_first_pass

        def noting(*args, **kwargs):
            queried.append(drafter.num_speculative_tokens)
            return first_pass(*args, **kwargs)
        drafter.set_inputs_first_pass = noting

    ids, counters, _ = generate(tiny_models["target"], tiny_models["draft"], num_spec=7,
                                options={"rule": "argmax", "rule_draft_length": 3},
                                spec_extra={"num_speculative_tokens_per_batch_size": [[1, 256, 2]]},
                                prepare=prepare)
    assert ids == plain32(stock)
    assert counters.num_draft_tokens == 2 * counters.num_drafts > 0
    assert {tuple(step["hidden"].shape[1:2]) for step in records} == {(2,)}
    assert set(queried) == {7}
    # The kept slots are the trained block's: the first draft step equals the unscheduled
    # engine's first 2 slots (a block of 3 queries would be another computation).
    _, _, whole = _served(tiny_models, 7, {"rule": "argmax", "rule_draft_length": 3})
    torch.testing.assert_close(records[0]["hidden"], whole[0]["hidden"][:, :2])
