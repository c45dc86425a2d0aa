"""DeLS over a reduced draft vocabulary (heads.dels.SubVocabShortHead, DelsRule(vocab_ids=...))
drafts what full-vocabulary DeLS drafts from the same drafter, whose logits are -inf outside
that vocabulary: the restricted path only does less work."""

import pytest
import torch

from test_dels import B, S, V, make_gru, make_markov, random_prior
from vllm_liliprop.heads.dels import SubVocabShortHead
from vllm_liliprop.rules.dels_draft import dels_draft, dels_draft_sampled
from vllm_liliprop.rules.base import DraftInputs
from vllm_liliprop.rules.dels import DelsRule

VOCAB = torch.tensor([0, 2, 3, 5, 8, 9, 11, 14, 17, 18, 20, 23, 26, 27, 29, 31])


def draft_logits(seed=1):
    """(full [B, S, V] with -inf outside VOCAB, the same logits over VOCAB [B, S, n])."""
    g = torch.Generator().manual_seed(seed)
    sub = 3.0 * torch.randn(B, S, VOCAB.numel(), generator=g)
    full = torch.full((B, S, V), float("-inf")).index_copy_(-1, VOCAB, sub)
    return full, sub


@pytest.mark.parametrize("make_head", [make_gru, make_markov], ids=["gru", "markov"])
@pytest.mark.parametrize("prefix_len", [0, 1])
def test_restricted_greedy_drafts_equal_full_vocabulary_drafts(make_head, prefix_len):
    head, log_prior = make_head(), random_prior().log_probs
    full, sub = draft_logits()
    anchors = torch.tensor([1, 4, 31, 7])  # anchors outside the draft vocabulary too
    expected = dels_draft(full, anchors, head, log_prior, 0.7, 0.4, pure_draft_prefix_len=prefix_len)
    ids, faulty = dels_draft(sub, anchors, SubVocabShortHead(head, VOCAB), log_prior[VOCAB], 0.7, 0.4,
                             pure_draft_prefix_len=prefix_len, return_faulty=True, vocab_ids=VOCAB)
    assert torch.equal(VOCAB[ids], expected)
    assert not faulty.any()
    assert expected.ne(full.argmax(-1)).any()  # the short head changed some drafts


@pytest.mark.parametrize("make_head", [make_gru, make_markov], ids=["gru", "markov"])
def test_restricted_sampled_distributions_equal_full_ones(make_head):
    head, log_prior = make_head(), random_prior().log_probs
    full, sub = draft_logits(2)
    anchors, temperature = torch.tensor([1, 4, 31, 7]), torch.tensor([1.0, 0.5, 0.0, 2.0])
    # Same drafted tokens in both: compare each slot's distribution given them (greedy rows
    # and slot 0 depend on no draw; later slots are compared through the fused rule below).
    _, full_probs = dels_draft_sampled(full, anchors, head, log_prior, 0.5, 0.3, temperature,
                                       torch.Generator().manual_seed(0))
    _, sub_probs = dels_draft_sampled(sub, anchors, SubVocabShortHead(head, VOCAB), log_prior[VOCAB],
                                      0.5, 0.3, temperature, torch.Generator().manual_seed(0),
                                      vocab_ids=VOCAB)
    torch.testing.assert_close(sub_probs[:, 0], full_probs[:, 0, VOCAB])
    assert torch.equal(full_probs[2, :, VOCAB], sub_probs[2])  # greedy row: one-hot, all slots


def test_rule_with_draft_vocab_maps_drafts_and_distributions_to_target_ids():
    head, log_prior = make_gru(), random_prior().log_probs
    full, sub = draft_logits(3)
    hidden = torch.randn(B, S, 4)
    lookup = {tuple(h.tolist()): i for i, h in enumerate(hidden.reshape(B * S, 4))}

    def logits_of(table):  # the drafter's logits of each hidden row, as vLLM would compute them
        return lambda h: table.reshape(B * S, -1)[[lookup[tuple(r.tolist())] for r in h]]

    inputs = DraftInputs(hidden=hidden, anchor_ids=torch.tensor([1, 4, 31, 7]),
                         compute_logits=logits_of(full), embed=None,
                         draft_vocab_logits=logits_of(sub), temperature=torch.ones(B))
    plain = DelsRule(head, log_prior, [0.3] * S, [0.3] * S, sampling="deterministic")
    reduced = DelsRule(head, log_prior, [0.3] * S, [0.3] * S, sampling="deterministic", vocab_ids=VOCAB)
    a, b = plain.propose(inputs), reduced.propose(inputs)
    assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.fallback_ids, b.fallback_ids)
    sampled = DelsRule(head, log_prior, [0.3] * S, [0.3] * S, sampling="probabilistic", vocab_ids=VOCAB)
    out = sampled.propose(inputs)
    assert out.probs.shape == (B, S, V) and torch.isin(out.token_ids, VOCAB).all()
    outside = torch.ones(V, dtype=torch.bool).index_fill_(0, VOCAB, False)
    assert out.probs[..., outside].eq(0).all()
    torch.testing.assert_close(out.probs.sum(-1), torch.ones(B, S))
