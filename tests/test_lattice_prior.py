"""The drafter's log-prob prior on a LiLiCorr walk (heads.lattice_prior, a liliprop extension):
what it adds, that a flat head then walks the drafter's argmax, its config key, and the rule."""

import pytest
import torch

from tests.test_lattice_head import TINY_FIELDS, lattice_inputs, randomize, tiny_config
from vllm_liliprop.heads import LatticeConfig, LatticeHead
from vllm_liliprop.heads.lattice_prior import PRIOR_KEY, with_logprob_prior
from vllm_liliprop.walks import greedy_walk


def test_prior_adds_each_candidates_log_prob_to_the_scores_that_enter_it():
    g = torch.Generator().manual_seed(0)
    start, pairs = torch.randn(2, 4, generator=g), torch.randn(2, 2, 4, 4, generator=g)
    log_probs = torch.randn(2, 3, 4, generator=g)
    new_start, new_pairs = with_logprob_prior(start, pairs, log_probs, 0.5)
    assert torch.allclose(new_start, start + 0.5 * log_probs[:, 0])
    for s in range(2):  # pair (s, i) -> (s + 1, j) gains slot s + 1's candidate j
        assert torch.allclose(new_pairs[:, s], pairs[:, s] + 0.5 * log_probs[:, s + 1, None, :])


def test_zero_weight_is_upstreams_walk_untouched():
    start, pairs, log_probs = torch.randn(2, 4), torch.randn(2, 2, 4, 4), torch.randn(2, 3, 4)
    new_start, new_pairs = with_logprob_prior(start, pairs, log_probs, 0.0)
    assert new_start is start and new_pairs is pairs


def test_a_flat_head_walks_the_drafters_argmax_and_a_strong_pair_overrides_it():
    log_probs = torch.log_softmax(torch.tensor([[[3.0, 1.0, 0.0], [2.0, 1.5, 0.0], [1.0, 0.5, 0.0]]]), -1)
    start, pairs = torch.zeros(1, 3), torch.zeros(1, 2, 3, 3)
    assert greedy_walk(*with_logprob_prior(start, pairs, log_probs, 1.0)).tolist() == [[0, 0, 0]]
    pairs[0, 0, 0, 1] = 2.0  # the head: after candidate 0 of slot 0, candidate 1 of slot 1
    assert greedy_walk(*with_logprob_prior(start, pairs, log_probs, 1.0)).tolist() == [[0, 1, 0]]


def test_config_key_round_trips_and_is_absent_at_zero():
    config = tiny_config()
    assert config.prior_weight == 0.0 and PRIOR_KEY not in config.to_dflash_config()
    exported = {**config.to_dflash_config(), PRIOR_KEY: 0.75}
    again = LatticeConfig.from_dflash_config(exported, 24, 5, 1e-6)
    assert again.prior_weight == 0.75 and again.to_dflash_config()[PRIOR_KEY] == 0.75


@pytest.mark.parametrize("value", [-1.0, float("nan"), "1", True])
def test_bad_prior_weight_names_the_key(value):
    with pytest.raises(ValueError, match=f"dflash_config.{PRIOR_KEY} = "):
        LatticeConfig.from_dflash_config({**TINY_FIELDS, PRIOR_KEY: value}, 24, 5, 1e-6)


def test_rule_walks_the_prior_scores():
    """LatticeRule's lattice = the head's scores plus the prior, from the head's own config."""
    import dataclasses

    from vllm_liliprop.heads import topk_candidates
    from vllm_liliprop.rules.lattice import LatticeRule

    head = LatticeHead(dataclasses.replace(tiny_config(), prior_weight=2.0))
    randomize(head, 1)
    g = torch.Generator().manual_seed(2)
    logits, table = torch.randn(3, 4, 50, generator=g) * 3, torch.randn(50, 24, generator=g)
    ids, log_probs = topk_candidates(logits.view(12, 50), 4)
    ids, log_probs = ids.view(3, 4, 4), log_probs.view(3, 4, 4)
    states = lattice_inputs(head.config, 3, 4, seed=3)
    plain = head.score(table[ids], log_probs, states["pass_hidden"], states["anchor_hidden"], states["anchor_valid"])
    start, pairs = with_logprob_prior(*plain, log_probs, 2.0)

    class Inputs:  # the slice of DraftInputs that LatticeRule.lattice reads
        hidden, anchor_hidden, anchor_valid = states["pass_hidden"], states["anchor_hidden"], states["anchor_valid"]
        long_logits = staticmethod(lambda: logits)
        embed = staticmethod(lambda candidate_ids: table[candidate_ids])

    lattice = LatticeRule(head, 50, reference=True).lattice(Inputs)
    assert torch.equal(lattice.candidate_ids, ids)
    assert torch.allclose(lattice.start, start, atol=1e-5) and torch.allclose(lattice.pairs, pairs, atol=1e-5)
    assert not torch.allclose(start, plain[0], atol=1e-3)  # the prior did change the scores
