"""Every draft rule flags the rows it could not score, with the fault in its real inputs.

Faults are injected where they arise in service: a NaN in a real head's weights (lattice head,
DeLS GRU/Markov head, unigram prior) or NaN/+inf/all -inf in the drafter's logits of some rows.
Each such row must be flagged (`DraftOutput.faulty_rows`) and get the drafter's argmax from
`apply_fallback`, and no other row may change. -inf alone is no fault: a reduced draft
vocabulary (DFlash's draft_vocab_size + d2t) makes vLLM's compute_logits return -inf at every
target id outside it. The engine-level counterpart is tests/test_rule_faults_vllm.py.
"""

import math

import pytest
import torch

from vllm_liliprop.faults import non_finite_rows
from vllm_liliprop.heads.dels import GRUShortHead, MarkovShortHead, UnigramPrior
from vllm_liliprop.heads.lattice import LatticeConfig, LatticeHead
from vllm_liliprop.rules import ArgmaxRule, DraftInputs, argmax_drafts
from vllm_liliprop.rules.dels import DelsRule
from vllm_liliprop.rules.fallback import apply_fallback
from vllm_liliprop.rules.lattice import LatticeRule
from vllm_liliprop.rules.lattice_dels import LatticeDelsRule

V, H, B, S, K = 40, 16, 4, 5, 4
NAN, INF = math.nan, math.inf
# Rows 0 and 2 sample, rows 1 and 3 are greedy: sampled rules see both kinds of row.
TEMPERATURE = torch.tensor([1.0, 0.0, 0.7, 0.0])


# ---------------------------------------------------------------- real heads, small

def lattice_head() -> LatticeHead:
    config = LatticeConfig(
        model_hidden_size=H, block_size=S + 1, rms_norm_eps=1e-6, candidate_topk=K,
        hidden_size=0, num_layers=1, num_heads=2, mlp_ratio=2.0, factor_dim=8,
        vector_eps=1e-6, logit_scale=8.0,
    )
    head = LatticeHead(config)
    head.init_weights(torch.Generator().manual_seed(0))
    return head.eval()


def short_head(kind: str):
    torch.manual_seed(1)
    if kind == "markov":
        return MarkovShortHead(V, 4).eval()
    return GRUShortHead(torch.randn(V, 8), hidden_size=12, rank=4).eval()


def log_prior() -> torch.Tensor:
    return UnigramPrior.from_counts(torch.arange(V) % 5).log_probs.clone()


# Each rule with the head weight whose NaN must flag every row (None: the rule has no head).
def _poison_lattice(rule):
    rule.head.in_head.weight[0, 0] = NAN


def _poison_short_head(rule):
    head = getattr(rule, "short_head", None) or rule.head
    if isinstance(head, MarkovShortHead):
        head.rank_to_vocab.weight[3, 0] = NAN
    else:
        head.gru.weight_hh_l0[0, 0] = NAN


def _poison_prior(rule):
    rule.log_prior.fill_(NAN)


def _rules():
    w = [0.3] * S
    yield "argmax", lambda: ArgmaxRule(), []
    for walk, sampling in (("greedy", "deterministic"), ("viterbi", "deterministic"),
                           ("greedy", "probabilistic")):
        yield (f"lattice-{walk}-{sampling}",
               lambda walk=walk, sampling=sampling: LatticeRule(lattice_head(), V, walk, sampling),
               [_poison_lattice])
    for kind in ("markov", "gru"):
        for prefix, sampling in ((0, "deterministic"), (1, "deterministic"), (0, "probabilistic")):
            yield (f"dels-{kind}-p{prefix}-{sampling}",
                   lambda kind=kind, prefix=prefix, sampling=sampling: DelsRule(
                       short_head(kind), log_prior(), w, w, prefix, sampling),
                   [_poison_short_head, _poison_prior])
    for kind, walk, sampling in (("markov", "greedy", "deterministic"),
                                 ("markov", "viterbi", "deterministic"),
                                 ("markov", "greedy", "probabilistic"),
                                 ("gru", "greedy", "deterministic")):
        yield (f"lattice+dels-{kind}-{walk}-{sampling}",
               lambda kind=kind, walk=walk, sampling=sampling: LatticeDelsRule(
                   lattice_head(), V, short_head(kind), log_prior(), w, w, 0, walk, sampling),
               [_poison_lattice, _poison_short_head, _poison_prior])


RULES = {name: (build, poisons) for name, build, poisons in _rules()}
HEAD_POISONS = [(name, poison) for name, (_, poisons) in RULES.items() for poison in poisons]


# ---------------------------------------------------------------- the drafter's side

def draft_inputs(edit_logits=None, draft_vocab: int = V) -> DraftInputs:
    """A batch from a fixed random drafter. draft_vocab < V masks the other ids to -inf, as
    vLLM's compute_logits does for a reduced draft vocabulary; edit_logits(logits [B, S, V])
    changes the logits in place (the drafter's fault)."""
    g = torch.Generator().manual_seed(0)
    lm_head = torch.randn(V, H, generator=g)
    embed = torch.nn.Embedding(V, H)
    with torch.no_grad():
        embed.weight.copy_(torch.randn(V, H, generator=g))

    def compute_logits(hidden):
        logits = hidden @ lm_head.T
        logits[:, draft_vocab:] = -INF
        if edit_logits is not None:
            edit_logits(logits.view(B, S, V))
        return logits

    return DraftInputs(
        hidden=torch.randn(B, S, H, generator=g),
        anchor_ids=torch.tensor([1, 2, 3, 4]),
        compute_logits=compute_logits,
        embed=embed,
        anchor_hidden=torch.randn(B, H, generator=g),
        anchor_valid=torch.ones(B, dtype=torch.bool),
        temperature=TEMPERATURE,
    )


def propose(rule, inputs, seed=0):
    torch.manual_seed(seed)  # sampled rules: the same draws for the rows a fault leaves alone
    return rule.propose(inputs)


def check_fallback(inputs, output, expected_faulty):
    """Flagged rows are exactly `expected_faulty` and get the drafter's argmax (and its one-hot
    distribution); returns the drafts after the fallback."""
    assert output.faulty_rows is not None, "the rule flags no rows at all"
    assert output.faulty_rows.dtype == torch.bool and output.faulty_rows.shape == (B,)
    assert output.faulty_rows.tolist() == expected_faulty
    token_ids, probs = apply_fallback(inputs, output)
    faulty = output.faulty_rows
    fallback = output.fallback_ids if output.fallback_ids is not None else argmax_drafts(inputs)
    assert torch.equal(token_ids[faulty], fallback[faulty])
    if probs is not None:
        assert torch.isfinite(probs).all()
        one_hot = torch.nn.functional.one_hot(fallback[faulty], V).float()
        assert torch.equal(probs[faulty], one_hot)
    return token_ids


# ---------------------------------------------------------------- the helper


def test_non_finite_rows_flags_nan_and_plus_inf_but_not_minus_inf():
    scores = torch.zeros(4, 2, 3)
    scores[0, 1, 2] = NAN
    scores[1, 0, 0] = INF
    scores[2, :, 1] = -INF  # ruled-out tokens: fine
    assert non_finite_rows(scores).tolist() == [True, True, False, False]


def test_non_finite_rows_flags_chosen_scores_that_are_minus_inf_and_broadcasts_shared_scores():
    chosen = torch.tensor([[0.0, -INF], [1.0, 2.0], [NAN, 0.0]])
    assert non_finite_rows(torch.zeros(3, 5), chosen=chosen).tolist() == [True, False, True]
    prior = torch.zeros(1, 5)
    assert non_finite_rows(torch.zeros(3, 5), prior).tolist() == [False] * 3
    prior[0, 4] = NAN  # one bad shared score: every row is faulty
    assert non_finite_rows(torch.zeros(3, 5), prior).tolist() == [True] * 3


# ---------------------------------------------------------------- every rule


@pytest.mark.parametrize("draft_vocab", [V, 24], ids=["full-vocab", "reduced-vocab"])
@pytest.mark.parametrize("name", RULES)
def test_finite_scores_and_minus_inf_of_a_reduced_vocabulary_flag_no_row(name, draft_vocab):
    """The -inf that vLLM returns outside a reduced draft vocabulary is not a fault, and the
    drafts stay inside that vocabulary."""
    inputs = draft_inputs(draft_vocab=draft_vocab)
    assert (inputs.long_logits() == -INF).any() == (draft_vocab < V)
    output = propose(RULES[name][0](), inputs)
    token_ids = check_fallback(inputs, output, [False] * B)
    assert int(token_ids.max()) < draft_vocab
    if output.probs is not None:
        assert float(output.probs[..., draft_vocab:].sum()) == 0.0


@pytest.mark.parametrize("name, poison", HEAD_POISONS,
                         ids=[f"{name}-{poison.__name__[len('_poison_'):]}"
                              for name, poison in HEAD_POISONS])
def test_nan_in_a_real_head_weight_flags_every_row_and_each_gets_the_argmax(name, poison):
    rule = RULES[name][0]()
    with torch.no_grad():
        poison(rule)
    inputs = draft_inputs()
    output = propose(rule, inputs)
    token_ids = check_fallback(inputs, output, [True] * B)
    assert torch.equal(token_ids, argmax_drafts(inputs))


def _nan_logit(logits):
    logits[0, 1, 7] = NAN


def _plus_inf_logit(logits):
    logits[1, 2, 5] = INF


def _all_minus_inf_slot(logits):
    logits[0, 0, :] = -INF


def _reduced_vocab_nan(logits):
    logits[1, 3, 2] = NAN  # a NaN inside a reduced vocabulary is still a fault
    logits[:, :, 24:] = -INF


DRAFTER_FAULTS = {"nan": (_nan_logit, [True, False, False, False]),
                  "plus-inf": (_plus_inf_logit, [False, True, False, False]),
                  "all-minus-inf": (_all_minus_inf_slot, [True, False, False, False]),
                  "nan-in-reduced-vocab": (_reduced_vocab_nan, [False, True, False, False])}


@pytest.mark.parametrize("fault", DRAFTER_FAULTS)
@pytest.mark.parametrize("name", RULES)
def test_non_finite_drafter_logits_flag_only_their_row(name, fault):
    """A NaN or +inf logit, or a slot where every token scores -inf (no finite choice), flags
    its row alone; the other rows keep the drafts of the healthy batch (sampled rules
    included: a greedy and a sampled row are hit in turn)."""
    edit, expected = DRAFTER_FAULTS[fault]
    healthy = propose(RULES[name][0](), draft_inputs())
    inputs = draft_inputs(edit)
    output = propose(RULES[name][0](), inputs)
    token_ids = check_fallback(inputs, output, expected)
    kept = ~torch.tensor(expected)
    if fault == "nan-in-reduced-vocab":  # the mask changes every row's scores
        assert int(token_ids[kept].max()) < 24
    else:
        assert torch.equal(token_ids[kept], healthy.token_ids[kept])
