"""The confidence cut (option `draft_confidence_floor`) in real vLLM engines: a greedy request's
draft ends where the product of its slots' confidence falls below the floor (counters predicted
to the token for a rule of known confidence), output stays plain decoding's, and requests
sampled at T > 0 keep their whole draft."""

from __future__ import annotations

import pytest
import torch

from tests.engine import counters_list, generate, plain32, predict_counters

pytestmark = pytest.mark.vllm
K = 7
FADING = "tests.policies:fading_repeat_anchor"  # confidence products 0.9, 0.45, 0.225, ...


@pytest.mark.parametrize("floor, kept", [(0.3, 2), (0.95, 0)])
def test_a_greedy_draft_ends_where_its_confidence_product_falls_below_the_floor(tiny_models, stock,
                                                                               floor, kept):
    ids, counters, _ = generate(tiny_models["target"], tiny_models["draft"],
                                options={"rule": FADING, "draft_confidence_floor": floor})
    assert ids == plain32(stock)
    predicted = [predict_counters([ys], lambda ys, p: [ys[p]] * kept, K) for ys in stock["plain"]["ids"]]
    summed = [sum(p[0] for p in predicted), sum(p[1] for p in predicted), sum(p[2] for p in predicted),
              [sum(p[3][i] for p in predicted) for i in range(K)]]
    assert counters_list(counters) == summed


def test_the_drafters_own_probability_cuts_its_argmax_without_changing_the_output(tiny_models, stock):
    seen = []

    def record(drafter):
        drafter.draft_rule.reports_confidence = True  # as a floor would build it, without a cut
        propose = drafter.draft_rule.propose

        def recording(inputs):
            output = propose(inputs)
            seen.append(output.confidence.cumprod(1).flatten())
            return output
        drafter.draft_rule.propose = recording

    whole = generate(tiny_models["target"], tiny_models["draft"], options={"rule": "argmax"},
                     prepare=record)[1]
    assert whole.num_draft_tokens == K * whole.num_drafts
    # A floor inside the range of the random tiny drafter's products: some slots kept, some cut.
    floor = float(torch.cat(seen).median())
    ids, counters, _ = generate(tiny_models["target"], tiny_models["draft"],
                                options={"rule": "argmax", "draft_confidence_floor": floor})
    assert ids == plain32(stock)
    assert 0 < counters.num_draft_tokens < K * counters.num_drafts


def test_sampled_requests_keep_their_whole_draft(tiny_models):
    _, counters, _ = generate(tiny_models["target"], tiny_models["draft"], temperature=1.0, seed=0,
                              options={"rule": FADING, "draft_confidence_floor": 0.3})
    assert counters.num_drafts > 0
    assert counters.num_draft_tokens == K * counters.num_drafts


def test_a_lilicorr_draft_is_cut_on_its_walked_candidates_probability(tiny_models, stock, tmp_path):
    """The lattice rule reports the drafter's probability of the candidate its walk took; a floor
    cuts some of its slots in a served engine and output stays plain decoding's."""
    from vllm_liliprop.fixtures import build_tiny_lilicorr_draft

    draft = str(build_tiny_lilicorr_draft(tmp_path / "lilicorr", tiny_models["target"]))
    ids, counters, drafter = generate(tiny_models["target"], draft,
                                      options={"walk": "greedy", "draft_confidence_floor": 0.001})
    assert drafter.draft_rule.name == "lattice-greedy" and drafter.draft_rule.reports_confidence
    assert ids == plain32(stock)
    assert drafter.num_rule_faults == 0
    assert 0 < counters.num_draft_tokens < K * counters.num_drafts
