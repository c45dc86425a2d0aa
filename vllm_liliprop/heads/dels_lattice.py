"""The DeLS-Spec bonus on a LiLiCorr candidate lattice (pure torch).

Notation: B requests, S = num_speculative_tokens slots, V vocabulary, K lattice candidates per
slot; `anchor_ids[B]` is the last verified token of each request. A walk picks index j_s of
candidate c[s, j] per slot and maximizes start[j_0] + sum_s pairs[s-1, j_{s-1}, j_s]. The
combined rule adds, at candidate c of slot s whose committed predecessor is p (the anchor for
slot 0, the chosen candidate of slot s - 1 otherwise),

    bonus_s(p, c) = alpha_s * log p_S(c | prefix) - beta_s * log_prior(c)

(the fusion of `dels.py` with the lattice scores in place of the long logits; the rule over
the drafter's whole vocabulary is `rules/dels_draft.py`).

With the Markov head the prefix is just p, so the bonus is a unary term on `start` (slot 0)
and a K x K term on `pairs` (slots >= 1): `lattice_dels_terms_markov` returns them, and any
walk (greedy, Viterbi, sampled) runs unchanged on (start + start_bonus, pairs + pair_bonus).
With the GRU head the prefix is the whole committed path, so only a step-by-step walk is
defined: `greedy_walk_with_short_head`. It leaves out the short head's log-normalizer because
within one step every candidate shares the predecessor, so the normalizer is a constant of
the row and cannot change a choice; this saves the V-wide logsumexp per step.

pure_draft_prefix_len P (0 or 1, a field of the DeLS config): as in `rules/dels_draft.py`;
with P = 1 slot 0 is walked on the lattice scores alone.

Ties: every argmax takes the lowest index (lowest candidate index).

Faults: with `return_faulty=True` the greedy walk also returns a [B] bool of the rows whose
scores were unusable (`vllm_liliprop.faults.non_finite_rows`).
"""

from __future__ import annotations

import torch

from vllm_liliprop.faults import non_finite_rows
from vllm_liliprop.heads.dels import MarkovShortHead, Schedule, check_prefix_len, slot_schedule

LATTICE_DELS_WALKS = ("greedy", "viterbi")


class LatticeDelsCombinationError(ValueError):
    """A lattice walk / short head pair with no well-defined DeLS score."""


def check_lattice_dels_walk(walk: str, head) -> None:
    """Raise ValueError unless `walk` over a lattice is well defined with this short head."""
    if walk not in LATTICE_DELS_WALKS:
        raise ValueError(f"walk={walk!r} is not a lattice walk; choose one of {LATTICE_DELS_WALKS}")
    if walk == "viterbi" and not isinstance(head, MarkovShortHead):
        kind = getattr(head, "kind", type(head).__name__)
        raise LatticeDelsCombinationError(
            f"walk='viterbi' with a {kind!r} DeLS short head is not defined: its state depends on "
            "the whole committed path, so there is no pairwise score for Viterbi to maximize. "
            "Use walk='greedy' with this head, or a 'markov' short head with walk='viterbi'.")


def _check_lattice_inputs(candidate_ids, anchor_ids, head, log_prior) -> tuple[int, int, int]:
    if candidate_ids.dim() != 3:
        raise ValueError(f"candidate_ids must be [B, S, K], got shape {tuple(candidate_ids.shape)}")
    batch, num_slots, num_candidates = candidate_ids.shape
    if anchor_ids.shape != (batch,):
        raise ValueError(f"anchor_ids must be [B={batch}], got shape {tuple(anchor_ids.shape)}")
    if log_prior.shape != (head.vocab_size,):
        raise ValueError(f"log_prior must be [V={head.vocab_size}] (the short head's vocabulary), "
                         f"got shape {tuple(log_prior.shape)}")
    return batch, num_slots, num_candidates


@torch.no_grad()
def lattice_dels_terms_markov(candidate_ids: torch.Tensor, anchor_ids: torch.Tensor,
                              head: MarkovShortHead, log_prior: torch.Tensor, alpha: Schedule,
                              beta: Schedule, *, pure_draft_prefix_len: int = 0
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The DeLS bonus on a lattice, for the Markov head (see module docstring).

    candidate_ids [B, S, K] int, anchor_ids [B] int, log_prior [V], alpha/beta number or [S].
    Returns fp32 (start_bonus [B, K], pair_bonus [B, S-1, K, K]):
      start_bonus[b, k]        = alpha_0 * log p_S(c[b,0,k] | anchor_b) - beta_0 * log_prior(c[b,0,k])
      pair_bonus[b, s-1, i, j] = alpha_s * log p_S(c[b,s,j] | c[b,s-1,i]) - beta_s * log_prior(c[b,s,j])
    (start_bonus is 0 when pure_draft_prefix_len = 1). Add them to (start, pairs) and run any walk.
    """
    if not isinstance(head, MarkovShortHead):
        raise LatticeDelsCombinationError(
            f"lattice_dels_terms_markov needs a MarkovShortHead, got {type(head).__name__}; a GRU "
            "head has no pairwise form, use greedy_walk_with_short_head for it")
    check_prefix_len(pure_draft_prefix_len)
    batch, num_slots, num_candidates = _check_lattice_inputs(candidate_ids, anchor_ids, head, log_prior)
    device = candidate_ids.device
    alphas = slot_schedule(alpha, num_slots, "alpha", device, pure_draft_prefix_len)
    betas = slot_schedule(beta, num_slots, "beta", device, pure_draft_prefix_len)
    prior_at = log_prior.float()[candidate_ids]  # [B, S, K]

    if pure_draft_prefix_len == 0:
        start_log_probs = (head.transition_logits(anchor_ids[:, None], candidate_ids[:, 0])[:, 0]
                           - head.log_normalizer(anchor_ids)[:, None])
        start_bonus = alphas[0] * start_log_probs - betas[0] * prior_at[:, 0]
    else:
        start_bonus = torch.zeros(batch, num_candidates, dtype=torch.float32, device=device)

    prev_ids, next_ids = candidate_ids[:, :-1], candidate_ids[:, 1:]
    pair_log_probs = (head.transition_logits(prev_ids, next_ids)
                      - head.log_normalizer(prev_ids)[..., None])  # [B, S-1, K, K]
    pair_bonus = (alphas[1:, None, None] * pair_log_probs
                  - betas[1:, None, None] * prior_at[:, 1:, None, :])
    return start_bonus, pair_bonus


@torch.no_grad()
def greedy_walk_with_short_head(start: torch.Tensor, pairs: torch.Tensor, candidate_ids: torch.Tensor,
                                anchor_ids: torch.Tensor, head, log_prior: torch.Tensor,
                                alpha: Schedule, beta: Schedule, *, pure_draft_prefix_len: int = 0,
                                return_faulty: bool = False):
    """Greedy lattice walk with the DeLS bonus evaluated step by step (any short head).

    start [B, K], pairs [B, S-1, K, K] (lattice scores, any float dtype), candidate_ids [B, S, K],
    anchor_ids [B], log_prior [V], alpha/beta number or [S]. Returns int64 [B, S] candidate
    indices; ties go to the lowest index. With the Markov head the choices equal a plain
    greedy walk over (start + start_bonus, pairs + pair_bonus) from `lattice_dels_terms_markov`.
    With return_faulty also faulty bool [B]: the scores some step chose among (lattice plus
    bonus) held NaN/+inf, or its pick scored -inf or NaN.
    """
    check_prefix_len(pure_draft_prefix_len)
    batch, num_slots, num_candidates = _check_lattice_inputs(candidate_ids, anchor_ids, head, log_prior)
    if start.shape != (batch, num_candidates):
        raise ValueError(f"start must be [B={batch}, K={num_candidates}], got {tuple(start.shape)}")
    if pairs.shape != (batch, num_slots - 1, num_candidates, num_candidates):
        raise ValueError(f"pairs must be [B, S-1, K, K] = {(batch, num_slots - 1, num_candidates, num_candidates)}, "
                         f"got {tuple(pairs.shape)}")
    device = candidate_ids.device
    alphas = slot_schedule(alpha, num_slots, "alpha", device, pure_draft_prefix_len)
    betas = slot_schedule(beta, num_slots, "beta", device, pure_draft_prefix_len)
    prior_at = log_prior.float()[candidate_ids]
    rows = torch.arange(batch, device=device)
    walk = torch.empty(batch, num_slots, dtype=torch.long, device=device)
    faulty = torch.zeros(batch, dtype=torch.bool, device=device)

    state = head.init_state(batch, device)
    if pure_draft_prefix_len == 0:
        state = head.advance(anchor_ids, state)
    scores = start.float()
    for slot in range(num_slots):
        if slot >= pure_draft_prefix_len:
            short_logits = head.logits_at(state, candidate_ids[:, slot])  # normalizer: row constant
            scores = scores + (alphas[slot] * short_logits - betas[slot] * prior_at[:, slot])
        chosen = scores.argmax(dim=-1)
        walk[:, slot] = chosen
        faulty |= non_finite_rows(scores, chosen=scores.gather(-1, chosen.unsqueeze(-1)).squeeze(-1))
        if slot + 1 < num_slots:
            state = head.advance(candidate_ids[rows, slot, chosen], state)
            scores = pairs[rows, slot, chosen].float()
    return (walk, faulty) if return_faulty else walk
