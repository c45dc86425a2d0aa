"""Every built-in rule reports, when built for `draft_confidence_floor`, the drafter's softmax
probability of each token it drafted (DraftOutput.confidence), and nothing otherwise. The cut
itself is tested in tests/test_draft_length.py and, served, in tests/test_confidence_cut_vllm.py."""

import math

import pytest
import torch

from vllm_liliprop.heads.dels import GRUShortHead, MarkovShortHead
from vllm_liliprop.heads.domino import DominoConfig, DominoHead
from vllm_liliprop.heads.dspark import MarkovBiasHead
from vllm_liliprop.heads.lattice import LatticeConfig, LatticeHead
from vllm_liliprop.rules import ArgmaxRule, DraftInputs
from vllm_liliprop.rules.dels import DelsRule
from vllm_liliprop.rules.domino import DominoRule
from vllm_liliprop.rules.dspark import DSparkRule
from vllm_liliprop.rules.lattice import LatticeRule
from vllm_liliprop.rules.lattice_dels import LatticeDelsRule

V, H, B, S, K, R = 40, 16, 3, 5, 4, 4
REDUCED = torch.arange(0, V, 2)  # a reduced draft vocabulary: every other target id


def _random(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    for param in module.parameters():
        torch.nn.init.normal_(param, std=0.5)
    return module.eval()


def _lattice_head() -> LatticeHead:
    config = LatticeConfig(model_hidden_size=H, block_size=S + 1, rms_norm_eps=1e-6,
                           candidate_topk=K, hidden_size=0, num_layers=1, num_heads=2,
                           mlp_ratio=2.0, factor_dim=8, vector_eps=1e-6, logit_scale=10.0)
    return _random(LatticeHead(config), 1)


def _rules(flag: bool):
    """(name, rule, reduced vocabulary?) for every built-in rule, built with or without the flag."""
    prior = torch.randn(V).log_softmax(-1)
    weights = [0.5] * S
    markov, gru = _random(MarkovShortHead(V, 8), 2), _random(GRUShortHead(torch.nn.Embedding(V, 8), 12, 8), 3)
    yield "argmax", ArgmaxRule(reports_confidence=flag), False
    yield "dels-markov", DelsRule(markov, prior, weights, weights, 0, reports_confidence=flag), False
    for walk in ("greedy", "viterbi"):
        yield f"lattice-{walk}", LatticeRule(_lattice_head(), V, walk, reports_confidence=flag), False
    yield "lattice+dels-gru", LatticeDelsRule(_lattice_head(), V, gru, prior, weights, weights, 0,
                                              reports_confidence=flag), False
    yield "lattice+dels-markov", LatticeDelsRule(_lattice_head(), V, markov, prior, weights, weights,
                                                 0, reports_confidence=flag), False
    for reduced in (False, True):
        ids = REDUCED if reduced else torch.arange(V)
        dspark = _random(MarkovBiasHead(V, ids.numel(), R, scale=1.5), 4)
        yield f"dspark-reduced{reduced}", DSparkRule(dspark, V, vocab_ids=ids if reduced else None,
                                                     reports_confidence=flag), reduced
        domino = _random(DominoHead(DominoConfig(V, 8, H, R), torch.randn(V, 8), ids), 5)
        yield f"domino-reduced{reduced}", DominoRule(domino, V, vocab_ids=ids if reduced else None,
                                                     reports_confidence=flag), reduced


def _inputs(reduced: bool) -> DraftInputs:
    generator = torch.Generator().manual_seed(7)
    lm_head = torch.randn(V, H, generator=generator)
    table = torch.randn(V, H, generator=generator)

    def full_logits(hidden):  # vLLM's compute_logits: -inf outside a reduced draft vocabulary
        logits = hidden @ lm_head.T
        if reduced:
            logits = torch.full_like(logits, -math.inf).index_copy_(-1, REDUCED, logits[:, REDUCED])
        return logits

    return DraftInputs(
        hidden=torch.randn(B, S, H, generator=generator) * 2,
        anchor_ids=torch.randint(0, V, (B,), generator=generator),
        compute_logits=full_logits, embed=lambda ids: table[ids],
        anchor_hidden=torch.randn(B, H, generator=generator),
        anchor_valid=torch.ones(B, dtype=torch.bool),
        draft_vocab_logits=(lambda hidden: hidden @ lm_head[REDUCED].T) if reduced else None,
    )


CASES = list(_rules(True))
NO_FLOOR = list(_rules(False))


@pytest.mark.parametrize("rule, reduced", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_rule_built_for_the_floor_reports_the_drafters_probability_of_its_draft(rule, reduced):
    inputs = _inputs(reduced)
    output = rule.propose(inputs)
    drafter = inputs.long_logits().softmax(-1)
    expected = drafter.gather(-1, output.token_ids.unsqueeze(-1)).squeeze(-1)
    assert output.confidence is not None and output.confidence.shape == (B, S)
    assert torch.allclose(output.confidence, expected, atol=1e-5)


def test_some_rule_drafts_other_than_the_argmax_so_the_check_above_is_not_the_argmaxs():
    """The rules' drafts differ from the drafter's argmax somewhere, so the test above checks the
    probability of the drafted token, not of the drafter's best."""
    differs = []
    for name, rule, reduced in CASES:
        inputs = _inputs(reduced)
        differs.append(not torch.equal(rule.propose(inputs).token_ids,
                                       inputs.long_logits().argmax(-1)))
    assert sum(differs) >= 4


@pytest.mark.parametrize("rule, reduced", [case[1:] for case in NO_FLOOR], ids=[case[0] for case in NO_FLOOR])
def test_without_the_floor_no_rule_reports_a_confidence(rule, reduced):
    assert rule.propose(_inputs(reduced)).confidence is None
