"""DeLS-Spec core: heads, prior, fusion, draft rules, lattice terms, on-disk format."""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from vllm_liliprop.heads.dels import GRUShortHead, MarkovShortHead, UnigramPrior, count_tokens, dels_fuse
from vllm_liliprop.heads.dels_io import (
    DelsConfig,
    find_dels_dir,
    import_dels_spec_checkpoint,
    load_dels_head,
    save_dels_head,
    tokenizer_fingerprint,
)
from vllm_liliprop.heads.dels_lattice import (
    LatticeDelsCombinationError,
    check_lattice_dels_walk,
    greedy_walk_with_short_head,
    lattice_dels_terms_markov,
)
from vllm_liliprop.rules.dels_draft import dels_draft, dels_draft_sampled

from vllm_liliprop.walks import greedy_walk, viterbi_walk

V, D, H, R = 32, 8, 12, 6
B, S, K = 4, 5, 4


def make_gru(seed=0, scale=4.0):
    torch.manual_seed(seed)
    embed = torch.randn(V, D)
    head = GRUShortHead(embed, hidden_size=H, rank=R)
    with torch.no_grad():
        head.rank_to_vocab.weight.mul_(scale)
    return head.eval()


def make_markov(seed=0, scale=2.0):
    torch.manual_seed(seed)
    head = MarkovShortHead(V, R)
    with torch.no_grad():
        head.rank_to_vocab.weight.mul_(scale)
    return head.eval()


def random_prior(seed=0):
    g = torch.Generator().manual_seed(seed)
    return UnigramPrior.from_counts(torch.randint(0, 50, (V,), generator=g))


def naive_dels_draft(long_logits, anchor_ids, head, log_prior, alphas, betas, prefix_len):
    """Recompute the short head from scratch on the whole committed prefix at every slot."""
    drafts = []
    for slot in range(long_logits.shape[1]):
        fused = long_logits[:, slot].float()
        if slot >= prefix_len:
            prefix = torch.stack(([anchor_ids] if prefix_len == 0 else []) + drafts, 1)
            short_log_probs = torch.log_softmax(head(prefix)[:, -1].float(), -1)
            fused = fused + alphas[slot] * short_log_probs - betas[slot] * log_prior
        drafts.append(fused.argmax(-1))
    return torch.stack(drafts, 1)


# ---------------------------------------------------------------- fusion


def test_fuse_matches_hand_computation():
    long = torch.tensor([[1.0, 2.0, 0.5]])
    short = torch.tensor([[0.0, 1.0, 3.0]])
    log_prior = torch.log(torch.tensor([0.5, 0.25, 0.25]))
    short_log_probs = [s - math.log(1 + math.e + math.e**3) for s in (0.0, 1.0, 3.0)]
    expected = [l + 0.3 * s - 0.7 * p for l, s, p in zip([1.0, 2.0, 0.5], short_log_probs, log_prior.tolist())]
    fused = dels_fuse(long, short, log_prior, 0.3, 0.7)
    assert fused.dtype == torch.float32
    torch.testing.assert_close(fused[0], torch.tensor(expected), rtol=0, atol=1e-6)


def test_fuse_zero_weights_is_long_exactly_and_bf16_upcast():
    torch.manual_seed(0)
    long = torch.randn(B, S, V).to(torch.bfloat16)
    fused = dels_fuse(long, torch.randn(B, S, V), random_prior().log_probs, 0.0, 0.0)
    assert torch.equal(fused, long.float())


def test_fuse_per_slot_schedule_changes_only_that_slot():
    torch.manual_seed(0)
    long, short = torch.randn(B, S, V), torch.randn(B, S, V)
    log_prior = random_prior().log_probs
    alpha = torch.zeros(S)
    beta = torch.zeros(S)
    alpha[2], beta[2] = 0.8, 0.4
    fused = dels_fuse(long, short, log_prior, alpha, beta)
    for slot in range(S):
        if slot == 2:
            assert not torch.equal(fused[:, slot], long[:, slot])
            torch.testing.assert_close(fused[:, slot], dels_fuse(long[:, slot], short[:, slot], log_prior, 0.8, 0.4))
        else:
            assert torch.equal(fused[:, slot], long[:, slot])
    # A Python list is the same schedule; a 0-dim entry fuses a single [B, V] slot.
    assert torch.equal(dels_fuse(long, short, log_prior, alpha.tolist(), beta.tolist()), fused)
    assert torch.equal(dels_fuse(long[:, 2], short[:, 2], log_prior, alpha[2], beta[2]), fused[:, 2])


def test_fuse_rejects_mismatched_schedule_and_prior():
    long = torch.randn(B, S, V)
    with pytest.raises(ValueError, match="alpha has 3 per-slot entries"):
        dels_fuse(long, long, torch.zeros(V), torch.ones(3), 0.0)
    with pytest.raises(ValueError, match="beta has 5 per-slot entries"):
        dels_fuse(long[:, 0], long[:, 0], torch.zeros(V), 0.0, torch.ones(S))
    with pytest.raises(ValueError, match="log_prior"):
        dels_fuse(long, long, torch.zeros(V + 1), 0.3, 0.3)


# ---------------------------------------------------------------- prior


def test_prior_smoothing_hand_example():
    prior = UnigramPrior.from_counts(torch.tensor([3, 0, 1]), smoothing=1.0)
    torch.testing.assert_close(prior.log_probs, torch.log(torch.tensor([4 / 7, 1 / 7, 2 / 7])))
    prior = UnigramPrior.from_counts(torch.tensor([3, 0, 1]), smoothing=0.5)
    torch.testing.assert_close(prior.log_probs, torch.log(torch.tensor([3.5, 0.5, 1.5]) / 5.5))


def test_prior_from_token_ids_counts_only_masked_tokens():
    ids = torch.tensor([[0, 0, 2, 1], [2, 2, 0, 1]])
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 0, 0]])
    assert count_tokens(ids, mask, 4).tolist() == [1, 0, 3, 0]
    prior = UnigramPrior.from_token_ids(ids, mask, vocab_size=4, smoothing=1.0)
    torch.testing.assert_close(prior.log_probs, torch.log(torch.tensor([2, 1, 4, 1]) / 8.0))


def test_prior_rejects_bad_input():
    with pytest.raises(ValueError, match="smoothing"):
        UnigramPrior.from_counts(torch.tensor([1, 0]), smoothing=0.0)
    with pytest.raises(ValueError, match="smoothing"):
        UnigramPrior.from_counts(torch.tensor([1, 0]), smoothing=-1.0)
    with pytest.raises(ValueError, match="vocab_size=4"):
        count_tokens(torch.tensor([5]), torch.tensor([1]), 4)


# ---------------------------------------------------------------- heads


def test_gru_step_equals_teacher_forcing():
    head = make_gru()
    prefix = torch.randint(0, V, (B, 7))
    full = head(prefix)
    state = head.init_state(B)
    for t in range(prefix.shape[1]):
        logits, state = head.step(prefix[:, t], state)
        torch.testing.assert_close(logits, full[:, t], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(head.logits_at(state, prefix[:, :3]), full[:, t].gather(1, prefix[:, :3]),
                                   rtol=1e-5, atol=1e-5)


def test_gru_embedding_is_shared_frozen_and_not_saved():
    embed = torch.nn.Embedding(V, D)
    head = GRUShortHead(embed, hidden_size=H, rank=R)
    assert head.embed_weight.data_ptr() == embed.weight.data_ptr()
    assert not any(p.data_ptr() == embed.weight.data_ptr() for p in head.parameters())
    assert not any(name.startswith("embed") for name in head.state_dict())


def test_markov_step_pair_logits_and_normalizer():
    head = make_markov()
    prefix = torch.randint(0, V, (B, 6))
    full = head(prefix)
    state = head.init_state(B)
    for t in range(prefix.shape[1]):
        logits, state = head.step(prefix[:, t], state)
        torch.testing.assert_close(logits, full[:, t])
    prev = torch.randint(0, V, (2, 3))
    expected = head.state_embed.weight[prev] @ head.rank_to_vocab.weight.T
    torch.testing.assert_close(head.pair_logits(prev), expected)
    torch.testing.assert_close(head.log_normalizer(prev), torch.logsumexp(expected, -1))
    nxt = torch.randint(0, V, (2, 4))
    torch.testing.assert_close(head.transition_logits(prev, nxt),
                               torch.gather(expected, 2, nxt[:, None, :].expand(2, 3, 4)))
    # The cached normalizer follows in-place weight updates (optimizer steps, load_state_dict).
    with torch.no_grad():
        head.rank_to_vocab.weight.mul_(2.0)
    torch.testing.assert_close(head.log_normalizer(prev), torch.logsumexp(2.0 * expected, -1))


# ---------------------------------------------------------------- dels_draft


@pytest.mark.parametrize("make_head", [make_gru, make_markov])
def test_zero_weights_reproduce_argmax_with_ties(make_head):
    torch.manual_seed(1)
    long = torch.randn(B, S, V).to(torch.bfloat16)
    long[:, :, 7] = long.max() + 1  # tie between ids 7 and 9: the lowest id wins
    long[:, :, 9] = long[:, :, 7]
    anchor = torch.randint(0, V, (B,))
    drafts = dels_draft(long, anchor, make_head(), random_prior().log_probs, 0.0, 0.0)
    assert torch.equal(drafts, long.argmax(-1))
    assert (drafts == 7).all()


@pytest.mark.parametrize("make_head", [make_gru, make_markov])
@pytest.mark.parametrize("prefix_len", [0, 1])
def test_dels_draft_equals_prefix_recomputation(make_head, prefix_len):
    torch.manual_seed(2)
    head, log_prior = make_head(), random_prior().log_probs
    long = torch.randn(B, S, V)
    anchor = torch.randint(0, V, (B,))
    alphas, betas = [0.5, 1.5, 2.0, 1.0, 3.0], [0.3, 0.1, 0.6, 0.0, 0.2]
    drafts = dels_draft(long, anchor, head, log_prior, alphas, betas, pure_draft_prefix_len=prefix_len)
    expected = naive_dels_draft(long, anchor, head, log_prior, alphas, betas, prefix_len)
    assert torch.equal(drafts, expected)
    assert not torch.equal(drafts, long.argmax(-1))  # the head really acted
    if prefix_len == 1:
        assert torch.equal(drafts[:, 0], long[:, 0].argmax(-1))


def test_schedule_on_one_slot_changes_only_that_slot():
    torch.manual_seed(3)
    head, log_prior = make_gru(), random_prior().log_probs
    long = torch.randn(16, S, V)
    anchor = torch.randint(0, V, (16,))
    alpha = torch.zeros(S)
    alpha[3] = 5.0
    drafts = dels_draft(long, anchor, head, log_prior, alpha, 0.0)
    plain = long.argmax(-1)
    keep = [s for s in range(S) if s != 3]
    assert torch.equal(drafts[:, keep], plain[:, keep])
    assert not torch.equal(drafts[:, 3], plain[:, 3])


def test_markov_head_that_predicts_next_token_steers_the_draft():
    # Short head: after token t, token (t + 5) % V with a margin of 40 logits.
    head = MarkovShortHead(V, V)
    with torch.no_grad():
        head.state_embed.weight.copy_(torch.eye(V))
        head.rank_to_vocab.weight.copy_(40.0 * torch.roll(torch.eye(V), shifts=5, dims=0))
    torch.manual_seed(4)
    long = torch.randn(B, S, V)  # long logits alone disagree with the chain below
    anchor = torch.tensor([0, 3, 10, 31])
    uniform = torch.full((V,), -math.log(V))
    drafts = dels_draft(long, anchor, head, uniform, 1.0, 0.0)
    expected = (anchor[:, None] + 5 * torch.arange(1, S + 1)) % V
    assert torch.equal(drafts, expected)
    assert not torch.equal(long.argmax(-1), expected)


def test_prior_term_penalizes_frequent_tokens():
    long = torch.zeros(1, 1, V)
    long[0, 0, 4] = 0.5  # slight long preference for 4, which is very frequent
    counts = torch.ones(V)
    counts[4] = 1000
    prior = UnigramPrior.from_counts(counts)
    head = make_markov()
    anchor = torch.tensor([0])
    assert dels_draft(long, anchor, head, prior.log_probs, 0.0, 0.0).item() == 4
    assert dels_draft(long, anchor, head, prior.log_probs, 0.0, 0.3).item() != 4


# ---------------------------------------------------------------- sampling


def test_sampled_probs_are_the_fused_softmax_and_match_frequencies():
    torch.manual_seed(5)
    vocab, n = 6, 40000
    head = MarkovShortHead(vocab, 3)
    with torch.no_grad():
        head.rank_to_vocab.weight.mul_(2.0)
    log_prior = UnigramPrior.from_counts(torch.tensor([5, 1, 3, 0, 2, 8])).log_probs
    long = torch.randn(1, 2, vocab).expand(n, 2, vocab)
    anchor = torch.full((n,), 2)
    temperature = torch.full((n,), 0.8)
    generator = torch.Generator().manual_seed(0)
    ids, probs = dels_draft_sampled(long, anchor, head, log_prior, 0.7, [0.2, 0.4], temperature, generator)
    assert probs.dtype == torch.float32 and probs.shape == (n, 2, vocab)
    # Slot 0: one distribution for every row; slot 1: conditioned on the sampled slot-0 token.
    fused0 = dels_fuse(long[0, 0], head.pair_logits(torch.tensor(2)), log_prior, 0.7, 0.2)
    torch.testing.assert_close(probs[0, 0], torch.softmax(fused0 / 0.8, -1))
    frequency0 = torch.bincount(ids[:, 0], minlength=vocab).float() / n
    assert (frequency0 - probs[0, 0]).abs().max() < 0.015
    for token in range(vocab):
        rows = ids[:, 0] == token
        if rows.sum() < 3000:
            continue
        fused1 = dels_fuse(long[0, 1], head.pair_logits(torch.tensor(token)), log_prior, 0.7, 0.4)
        torch.testing.assert_close(probs[rows, 1], torch.softmax(fused1 / 0.8, -1).expand(int(rows.sum()), vocab))
        frequency1 = torch.bincount(ids[rows, 1], minlength=vocab).float() / rows.sum()
        assert (frequency1 - probs[rows, 1][0]).abs().max() < 0.03


def test_sampled_zero_temperature_rows_are_greedy_one_hot():
    torch.manual_seed(6)
    head, log_prior = make_gru(), random_prior().log_probs
    long = torch.randn(B, S, V)
    anchor = torch.randint(0, V, (B,))
    temperature = torch.tensor([0.0, 1.0, 1e-6, 0.5])  # below 1e-5 is greedy, as in vLLM
    ids, probs = dels_draft_sampled(long, anchor, head, log_prior, 0.5, 0.3, temperature,
                                    torch.Generator().manual_seed(1))
    greedy = dels_draft(long, anchor, head, log_prior, 0.5, 0.3)
    for row in (0, 2):
        assert torch.equal(ids[row], greedy[row])
        assert torch.equal(probs[row], F.one_hot(greedy[row], V).float())
    assert torch.allclose(probs.sum(-1), torch.ones(B, S))
    assert not torch.equal(probs[1], F.one_hot(ids[1], V).float())
    with pytest.raises(ValueError, match="temperature"):
        dels_draft_sampled(long, anchor, head, log_prior, 0.5, 0.3, torch.ones(B + 1))


# ---------------------------------------------------------------- lattice


def random_lattice(seed):
    g = torch.Generator().manual_seed(seed)
    candidate_ids = torch.stack([torch.randperm(V, generator=g)[:K] for _ in range(B * S)]).view(B, S, K)
    return (torch.randn(B, K, generator=g), torch.randn(B, S - 1, K, K, generator=g), candidate_ids,
            torch.randint(0, V, (B,), generator=g))


def test_markov_lattice_terms_match_the_formula():
    head, log_prior = make_markov(), random_prior().log_probs
    _, _, candidate_ids, anchor = random_lattice(0)
    alphas, betas = [0.4, 0.9, 1.3, 0.2, 0.7], [0.3, 0.5, 0.1, 0.0, 0.6]
    start_bonus, pair_bonus = lattice_dels_terms_markov(candidate_ids, anchor, head, log_prior, alphas, betas)
    assert start_bonus.shape == (B, K) and pair_bonus.shape == (B, S - 1, K, K)
    log_p = torch.log_softmax(head.pair_logits(torch.arange(V)), -1)  # [prev, next]
    for b in range(B):
        for k in range(K):
            c = candidate_ids[b, 0, k]
            expected = alphas[0] * log_p[anchor[b], c] - betas[0] * log_prior[c]
            torch.testing.assert_close(start_bonus[b, k], expected)
        for s in range(1, S):
            for i in range(K):
                for j in range(K):
                    p, c = candidate_ids[b, s - 1, i], candidate_ids[b, s, j]
                    expected = alphas[s] * log_p[p, c] - betas[s] * log_prior[c]
                    torch.testing.assert_close(pair_bonus[b, s - 1, i, j], expected)
    _, pair_bonus_1 = lattice_dels_terms_markov(candidate_ids, anchor, head, log_prior, alphas, betas,
                                                pure_draft_prefix_len=1)
    start_bonus_1, _ = lattice_dels_terms_markov(candidate_ids, anchor, head, log_prior, alphas, betas,
                                                 pure_draft_prefix_len=1)
    assert torch.equal(start_bonus_1, torch.zeros(B, K))
    assert torch.equal(pair_bonus_1, pair_bonus)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("prefix_len", [0, 1])
def test_markov_pairwise_form_through_greedy_walk_equals_step_walk(seed, prefix_len):
    head, log_prior = make_markov(seed), random_prior(seed).log_probs
    start, pairs, candidate_ids, anchor = random_lattice(seed)
    alphas, betas = [1.5, 0.5, 2.0, 1.0, 3.0], [0.3, 0.6, 0.1, 0.4, 0.2]
    start_bonus, pair_bonus = lattice_dels_terms_markov(candidate_ids, anchor, head, log_prior, alphas, betas,
                                                        pure_draft_prefix_len=prefix_len)
    pairwise = greedy_walk(start + start_bonus, pairs + pair_bonus)
    stepwise = greedy_walk_with_short_head(start, pairs, candidate_ids, anchor, head, log_prior, alphas, betas,
                                           pure_draft_prefix_len=prefix_len)
    assert torch.equal(pairwise, stepwise)
    if seed == 0 and prefix_len == 0:
        assert not torch.equal(stepwise, greedy_walk(start, pairs))  # the bonus really acted


@pytest.mark.parametrize("prefix_len", [0, 1])
def test_gru_step_walk_equals_full_prefix_recomputation(prefix_len):
    head, log_prior = make_gru(), random_prior().log_probs
    start, pairs, candidate_ids, anchor = random_lattice(7)
    alphas, betas = [2.0, 1.0, 3.0, 0.5, 2.5], [0.2, 0.4, 0.3, 0.1, 0.5]
    rows = torch.arange(B)
    scores, committed, expected = start, [], []
    for s in range(S):
        if s >= prefix_len:
            prefix = torch.stack(([anchor] if prefix_len == 0 else []) + committed, 1)
            log_p = torch.log_softmax(head(prefix)[:, -1], -1)
            scores = scores + alphas[s] * log_p.gather(1, candidate_ids[:, s]) - betas[s] * log_prior[candidate_ids[:, s]]
        chosen = scores.argmax(-1)
        expected.append(chosen)
        committed.append(candidate_ids[rows, s, chosen])
        if s + 1 < S:
            scores = pairs[rows, s, chosen]
    walk = greedy_walk_with_short_head(start, pairs, candidate_ids, anchor, head, log_prior, alphas, betas,
                                       pure_draft_prefix_len=prefix_len)
    assert torch.equal(walk, torch.stack(expected, 1))
    zero = greedy_walk_with_short_head(start, pairs, candidate_ids, anchor, head, log_prior, 0.0, 0.0)
    assert torch.equal(zero, greedy_walk(start, pairs))


def test_markov_lattice_walks_through_walks_module():
    """The Markov bonus as lattice terms: the walks module's greedy walk over them equals the
    step-by-step walk, and its Viterbi walk finds the best summed DeLS path score."""
    head, log_prior = make_markov(1), random_prior(1).log_probs
    start, pairs, candidate_ids, anchor = random_lattice(3)
    alphas, betas = [1.0, 2.0, 0.5, 1.5, 1.0], 0.3
    start_bonus, pair_bonus = lattice_dels_terms_markov(candidate_ids, anchor, head, log_prior, alphas, betas)
    greedy = greedy_walk(start.float() + start_bonus, pairs.float() + pair_bonus)
    assert torch.equal(greedy, greedy_walk_with_short_head(start, pairs, candidate_ids, anchor, head, log_prior,
                                                           alphas, betas))
    best = viterbi_walk(start.float() + start_bonus, pairs.float() + pair_bonus)
    # Brute force over all K^S paths of the summed DeLS path score:
    # lattice + sum_s alpha_s log p_S(c_s | c_{s-1}) - beta_s log_prior(c_s).
    log_p = torch.log_softmax(head.pair_logits(torch.arange(V)), -1).double()
    paths = torch.cartesian_prod(*[torch.arange(K)] * S)  # [K^S, S]
    for b in range(B):
        tokens = candidate_ids[b, torch.arange(S), paths]  # [K^S, S]
        score = start[b, paths[:, 0]].double()
        score = score + alphas[0] * log_p[anchor[b], tokens[:, 0]] - betas * log_prior[tokens[:, 0]].double()
        for s in range(1, S):
            score = score + pairs[b, s - 1, paths[:, s - 1], paths[:, s]].double()
            score = score + alphas[s] * log_p[tokens[:, s - 1], tokens[:, s]] - betas * log_prior[tokens[:, s]].double()
        assert torch.equal(best[b], paths[score.argmax()])


def test_viterbi_with_gru_is_a_clear_error():
    gru, markov = make_gru(), make_markov()
    check_lattice_dels_walk("greedy", gru)
    check_lattice_dels_walk("viterbi", markov)
    with pytest.raises(LatticeDelsCombinationError, match="walk='greedy'.*'markov'"):
        check_lattice_dels_walk("viterbi", gru)
    with pytest.raises(ValueError, match="choose one of"):
        check_lattice_dels_walk("beam", markov)
    start, pairs, candidate_ids, anchor = random_lattice(0)
    with pytest.raises(LatticeDelsCombinationError, match="greedy_walk_with_short_head"):
        lattice_dels_terms_markov(candidate_ids, anchor, gru, random_prior().log_probs, 0.3, 0.3)


# ---------------------------------------------------------------- on-disk format


class FakeTokenizer:
    def __init__(self, vocab):
        self.vocab = vocab

    def get_vocab(self):
        return dict(self.vocab)


def test_tokenizer_fingerprint():
    vocab = {"a": 0, "b": 1, "<s>": 2}
    fingerprint = tokenizer_fingerprint(FakeTokenizer(vocab))
    assert fingerprint.startswith("sha256:") and len(fingerprint) == 7 + 64
    assert tokenizer_fingerprint({"<s>": 2, "b": 1, "a": 0}) == fingerprint
    assert tokenizer_fingerprint({"a": 0, "b": 1, "<S>": 2}) != fingerprint


def saved_gru(tmp_path, **fields):
    head, prior = make_gru(), random_prior()
    config = DelsConfig.for_head(head, prior, tokenizer_fingerprint="sha256:abc", **fields)
    folder = save_dels_head(tmp_path / "draft" / "dels", head, prior, config)
    return head, prior, config, folder


def test_gru_roundtrip_shares_target_embedding(tmp_path):
    head, prior, config, folder = saved_gru(tmp_path, alpha=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    assert "embed.weight" not in load_file(str(folder / "model.safetensors"))
    loaded, loaded_prior, loaded_config = load_dels_head(tmp_path / "draft", head.embed_weight, V, "sha256:abc")
    assert loaded_config == config and loaded_config.pure_draft_prefix_len == 0
    assert loaded.embed_weight.data_ptr() == head.embed_weight.data_ptr()
    assert torch.equal(loaded_prior.log_probs, prior.log_probs) and loaded_prior.smoothing == 1.0
    prefix = torch.randint(0, V, (B, 5))
    assert torch.equal(loaded(prefix), head(prefix))
    assert loaded_config.slot_weights("alpha", 4) == [0.1, 0.2, 0.3, 0.4]
    assert loaded_config.slot_weights("beta", 3) == [0.3, 0.3, 0.3]
    with pytest.raises(ValueError, match="'alpha' has 6 per-slot weights"):
        loaded_config.slot_weights("alpha", 8)
    bf16, _, _ = load_dels_head(folder, head.embed_weight, V, dtype=torch.bfloat16)
    assert bf16.rank_to_vocab.weight.dtype == torch.bfloat16 and bf16.embed_weight.dtype == torch.float32


def test_markov_and_own_embedding_roundtrips(tmp_path):
    markov, prior = make_markov(), random_prior()
    save_dels_head(tmp_path / "m", markov, prior, DelsConfig.for_head(markov, prior, pure_draft_prefix_len=1))
    loaded, _, config = load_dels_head(tmp_path / "m", None, V)
    assert config.kind == "markov" and config.pure_draft_prefix_len == 1
    ids = torch.randint(0, V, (3,))
    assert torch.equal(loaded.pair_logits(ids), markov.pair_logits(ids))

    gru = make_gru()
    save_dels_head(tmp_path / "g", gru, prior, DelsConfig.for_head(gru, prior, embedding_source="checkpoint"))
    loaded, _, _ = load_dels_head(tmp_path / "g", None, V)
    assert torch.equal(loaded.embed_weight, gru.embed_weight)
    prefix = torch.randint(0, V, (2, 4))
    assert torch.equal(loaded(prefix), gru(prefix))


def test_load_validation_errors(tmp_path):
    head, prior, config, folder = saved_gru(tmp_path)
    embed = head.embed_weight

    def rewrite_config(**changes):
        data = json.loads((folder / "config.json").read_text())
        data.update(changes)
        (folder / "config.json").write_text(json.dumps(data))

    with pytest.raises(ValueError, match="vocab_size.*trained for vocab_size=32.*has 40 logits"):
        load_dels_head(folder, embed, 40)
    with pytest.raises(ValueError, match="tokenizer_fingerprint.*different tokenizer"):
        load_dels_head(folder, embed, V, "sha256:other")
    with pytest.raises(ValueError, match="embed_dim.*reads 8-wide.*6 wide"):
        load_dels_head(folder, torch.randn(V, 6), V)
    with pytest.raises(ValueError, match="target_embedding_weight is required"):
        load_dels_head(folder, None, V)

    tensors = load_file(str(folder / "model.safetensors"))
    save_file({**tensors, "prior.log_probs": torch.zeros(V - 1)}, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="prior.log_probs.*rebuild the prior"):
        load_dels_head(folder, embed, V)
    save_file(tensors, str(folder / "model.safetensors"))

    rewrite_config(hidden_size=H + 1)
    with pytest.raises(ValueError, match="gru.weight_hh_l0.*config.json and the weights disagree"):
        load_dels_head(folder, embed, V)
    rewrite_config(hidden_size=H, kind="lstm")
    with pytest.raises(ValueError, match=r"kind='lstm' is unknown; set kind to one of \('gru', 'markov'\)"):
        load_dels_head(folder, embed, V)
    rewrite_config(kind="gru", liliprop_dels_format=2)
    with pytest.raises(ValueError, match="liliprop_dels_format=2 is not supported"):
        load_dels_head(folder, embed, V)
    rewrite_config(liliprop_dels_format=1, alpah=0.3)
    with pytest.raises(ValueError, match=r"unknown DeLS config fields \['alpah'\]"):
        load_dels_head(folder, embed, V)
    with pytest.raises(ValueError, match="no DeLS head"):
        find_dels_dir(tmp_path)


def test_save_refuses_to_overwrite_a_model_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["DFlashDraftModel"]}))
    head, prior = make_markov(), random_prior()
    with pytest.raises(ValueError, match="save into .*dels instead"):
        save_dels_head(tmp_path, head, prior, DelsConfig.for_head(head, prior))
    with pytest.raises(ValueError, match="config.rank=7 does not match"):
        save_dels_head(tmp_path / "dels", head, prior, DelsConfig(kind="markov", vocab_size=V, rank=7))


# ---------------------------------------------------------------- public DeLS-Spec layout


def reference_public_gru_logits(state, embed, prefix, activation, vocab_rows):
    gru = torch.nn.GRU(embed.shape[1], state["prefix_gru.weight_hh_l0"].shape[1], bias=False, batch_first=True)
    gru.load_state_dict({"weight_ih_l0": state["prefix_gru.weight_ih_l0"],
                         "weight_hh_l0": state["prefix_gru.weight_hh_l0"]})
    hidden, _ = gru(embed[prefix])
    rank_state = hidden @ state["rank_proj.weight"].T
    if activation == "silu":
        rank_state = F.silu(rank_state)
    return rank_state @ vocab_rows.T


@pytest.mark.parametrize("lm_head_mode", ["low_rank", "target_lm_head"])
def test_import_public_gru_checkpoint(tmp_path, lm_head_mode):
    torch.manual_seed(8)
    embed, target_lm_head = torch.randn(V, D), torch.randn(V, 10)
    state = {"prefix_gru.weight_ih_l0": torch.randn(3 * H, D), "prefix_gru.weight_hh_l0": torch.randn(3 * H, H),
             "rank_proj.weight": torch.randn(R, H)}
    if lm_head_mode == "low_rank":
        state["low_rank_lm_head.weight"] = torch.randn(V, R)
        vocab_rows = state["low_rank_lm_head.weight"]
    else:
        state["rank_to_hidden.weight"] = torch.randn(10, R)
        vocab_rows = target_lm_head @ state["rank_to_hidden.weight"]
    model_config = {"vocab_size": V, "embed_dim": D, "gru_hidden_dim": H, "low_rank_dim": R,
                    "lm_head_mode": lm_head_mode}  # no rank_activation: the public default is identity
    torch.save({"model_config": model_config, "model_state_dict": state}, tmp_path / "local_head.pt")
    torch.save({"counts": torch.arange(V - 2)}, tmp_path / "loss_mask_unigram.pt")

    head, prior, config = import_dels_spec_checkpoint(tmp_path / "local_head.pt", tmp_path, embed,
                                                      target_lm_head_weight=target_lm_head)
    assert config.kind == "gru" and config.pure_draft_prefix_len == 1 and config.rank_activation == "identity"
    prefix = torch.randint(0, V, (B, 6))
    torch.testing.assert_close(head(prefix), reference_public_gru_logits(state, embed, prefix, "identity", vocab_rows),
                               rtol=1e-4, atol=1e-4)
    counts = torch.cat([torch.arange(V - 2), torch.zeros(2)]).double()
    torch.testing.assert_close(prior.log_probs, (torch.log(counts + 1) - torch.log((counts + 1).sum())).float())
    save_dels_head(tmp_path / "dels", head, prior, config)
    loaded, _, _ = load_dels_head(tmp_path, embed, V)
    assert torch.equal(loaded(prefix), head(prefix))


def test_import_public_markov_checkpoints(tmp_path):
    torch.manual_seed(9)
    embedding_weight, lm_head_weight = torch.randn(V, R), torch.randn(V, R)
    torch.save({"embedding_weight": embedding_weight, "lm_head_weight": lm_head_weight}, tmp_path / "merged.pt")
    np.savez(tmp_path / "loss_mask_unigram.npz", counts=np.arange(V))
    head, prior, config = import_dels_spec_checkpoint(tmp_path / "merged.pt", tmp_path / "loss_mask_unigram.npz", None)
    ids = torch.randint(0, V, (5,))
    torch.testing.assert_close(head.pair_logits(ids), embedding_weight[ids] @ lm_head_weight.T)
    assert config.kind == "markov" and prior.vocab_size == V

    target_embed, target_lm_head = torch.randn(V, D), torch.randn(V, 10)
    down_proj, up_proj = torch.randn(D, R), torch.randn(R, 10)
    torch.save({"model_config": {"rank": R}, "model_state_dict": {"down_proj": down_proj, "up_proj": up_proj}},
               tmp_path / "markov_local_head.pt")
    with pytest.raises(ValueError, match="target_lm_head_weight"):
        import_dels_spec_checkpoint(tmp_path / "markov_local_head.pt", tmp_path, target_embed)
    head, _, _ = import_dels_spec_checkpoint(tmp_path / "markov_local_head.pt", tmp_path, target_embed,
                                             target_lm_head_weight=target_lm_head)
    torch.testing.assert_close(head.pair_logits(ids), (target_embed[ids] @ down_proj) @ (target_lm_head @ up_proj.T).T,
                               rtol=1e-4, atol=1e-4)
