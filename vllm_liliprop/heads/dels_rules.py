"""DeLS-Spec draft rules over DFlash long logits, alone or on a LiLiCorr candidate lattice.

Notation: B requests, S = num_speculative_tokens slots, V vocabulary, K lattice candidates per
slot; `anchor_ids[B]` is the last verified token of each request. The committed prefix of
slot s is (anchor, d_0, ..., d_{s-1}) where d_t is the token committed at slot t.

The one formula (see `dels.py`): slot s scores token v as

    long_s(v) + alpha_s * log p_S(v | prefix_s) - beta_s * log_prior(v)

with log p_S = log_softmax of the short head's logits. `dels_draft` takes the argmax over the
full vocabulary; `dels_draft_sampled` samples from softmax(score / T).

On the lattice the long term is replaced by the lattice scores: a walk picks index j_s of
candidate c[s, j] per slot and maximizes start[j_0] + sum_s pairs[s-1, j_{s-1}, j_s]. The
combined rule adds, at candidate c of slot s whose committed predecessor is p (the anchor for
slot 0, the chosen candidate of slot s - 1 otherwise),

    bonus_s(p, c) = alpha_s * log p_S(c | prefix) - beta_s * log_prior(c).

With the Markov head the prefix is just p, so the bonus is a unary term on `start` (slot 0)
and a K x K term on `pairs` (slots >= 1): `lattice_dels_terms_markov` returns them, and any
walk (greedy, Viterbi, sampled) runs unchanged on (start + start_bonus, pairs + pair_bonus).
With the GRU head the prefix is the whole committed path, so only a step-by-step walk is
defined: `greedy_walk_with_short_head`. It leaves out the short head's log-normalizer because
within one step every candidate shares the predecessor, so the normalizer is a constant of
the row and cannot change a choice; this saves the V-wide logsumexp per step.

pure_draft_prefix_len P (0 or 1, a field of the DeLS config): P = 0 is this project's rule,
every slot is corrected and the short head reads the anchor first. P = 1 reproduces the
public DeLS-Spec runtime, which its released heads were trained for: slot 0 is drafted from
the long (or lattice) scores alone and the short prefix starts at d_0, without the anchor.

Ties: every argmax takes the lowest index (lowest token id, lowest candidate index).

Faults: with `return_faulty=True` the drafting functions also return a [B] bool of the rows
whose scores were unusable (`vllm_liliprop.faults.non_finite_rows`: NaN or +inf in a score, or
a drafted token that scored -inf or NaN), computed on the device, so the caller can fall back
for those rows without a host read. -inf scores alone (a reduced draft vocabulary) are fine.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from vllm_liliprop.faults import non_finite_rows
from vllm_liliprop.heads.dels import MarkovShortHead, dels_fuse
from vllm_liliprop.kernels import dels_argmax
from vllm_liliprop.walks import GREEDY_TEMPERATURE

LATTICE_DELS_WALKS = ("greedy", "viterbi")

Schedule = float | Sequence[float] | torch.Tensor


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


def _check_prefix_len(pure_draft_prefix_len: int) -> None:
    if pure_draft_prefix_len not in (0, 1):
        raise ValueError(f"pure_draft_prefix_len={pure_draft_prefix_len!r} must be 0 (correct every "
                         "slot, short head reads the anchor) or 1 (public DeLS-Spec layout)")


def slot_schedule(value: Schedule, num_slots: int, name: str, device: torch.device | str,
                  pure_draft_prefix_len: int = 0) -> torch.Tensor:
    """A weight or a per-slot list/tensor -> fresh fp32 [S] with slots < P set to 0."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number or a per-slot schedule, got a bool")
    if isinstance(value, (int, float)):
        weights = torch.full((num_slots,), float(value), dtype=torch.float32, device=device)
    else:
        weights = torch.as_tensor(value, dtype=torch.float32).to(device).reshape(-1).clone()
        if torch.as_tensor(value).dim() > 1 or weights.numel() not in (1, num_slots):
            raise ValueError(f"{name} must be a number or a schedule of {num_slots} per-slot "
                             f"weights (one per speculative token), got {weights.numel()} entries")
        weights = weights.expand(num_slots).clone()
    weights[:pure_draft_prefix_len] = 0.0
    return weights


def _check_draft_inputs(long_logits, anchor_ids, head, log_prior) -> tuple[int, int, int]:
    if long_logits.dim() != 3:
        raise ValueError(f"long_logits must be [B, S, V], got shape {tuple(long_logits.shape)}")
    batch, num_slots, vocab_size = long_logits.shape
    if anchor_ids.shape != (batch,):
        raise ValueError(f"anchor_ids must be [B={batch}], got shape {tuple(anchor_ids.shape)}")
    if head.vocab_size != vocab_size:
        raise ValueError(f"the short head has vocab_size={head.vocab_size} but long_logits has "
                         f"V={vocab_size}; load a DeLS head trained for this drafter's vocabulary")
    if log_prior.shape != (vocab_size,):
        raise ValueError(f"log_prior must be [V={vocab_size}], got shape {tuple(log_prior.shape)}")
    return batch, num_slots, vocab_size


def _picked(scores: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """scores [B, ..., V] at ids [B, ...] -> [B, ...]."""
    return scores.gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def _long_and_prior_faults(long_logits, log_prior, draft_ids, pure_draft_prefix_len):
    """[B] bool: NaN/+inf in the long logits or the prior, or a drafted token whose long logit
    (any slot) or prior (fused slots) is not finite."""
    chosen = (_picked(long_logits, draft_ids), log_prior[draft_ids[:, pure_draft_prefix_len:]])
    return non_finite_rows(long_logits, log_prior[None], chosen=chosen)


def _draft(long_logits, anchor_ids, head, log_prior, alpha, beta, pure_draft_prefix_len, pick,
           vocab_ids=None):
    """Shared slot loop. pick(slot, long [B, V], short [B, V] raw short-head logits or None for
    a pure-draft slot, alpha_s, beta_s) -> committed ids [B].

    Returns (ids int64 [B, S], faulty bool [B]): a row is faulty when a term of its fused scores
    holds NaN/+inf or its drafted token's fused score is not finite. The terms are checked at
    the drafted id instead of forming the fused scores again (the argmax kernel never forms
    them), which is exact: with no NaN/+inf anywhere, log_softmax(short) at the id is finite
    iff short[id] is (the normalizer is then finite too), finite terms sum to a finite score,
    and a -inf term makes it -inf or NaN (0 * -inf under a zero weight). The short logits are
    checked slot by slot, so no [B, S, V] of them is kept.

    vocab_ids [V] (target ids), for a head restricted to a draft vocabulary
    (`dels.SubVocabShortHead`): scores and drafted ids index that vocabulary, and the head
    consumes each drafted token as its target id."""
    _check_prefix_len(pure_draft_prefix_len)
    batch, num_slots, _ = _check_draft_inputs(long_logits, anchor_ids, head, log_prior)
    device = long_logits.device
    alphas = slot_schedule(alpha, num_slots, "alpha", device, pure_draft_prefix_len)
    betas = slot_schedule(beta, num_slots, "beta", device, pure_draft_prefix_len)
    draft_ids = torch.empty(batch, num_slots, dtype=torch.long, device=device)
    state = head.init_state(batch, device)
    if pure_draft_prefix_len == 0:
        state = head.advance(anchor_ids, state)
    faulty = torch.zeros(batch, dtype=torch.bool, device=device)
    for slot in range(num_slots):
        short_logits = None if slot < pure_draft_prefix_len else head.logits_from_state(state)
        draft_ids[:, slot] = pick(slot, long_logits[:, slot], short_logits, alphas[slot], betas[slot])
        if short_logits is not None:
            faulty |= non_finite_rows(short_logits, chosen=_picked(short_logits, draft_ids[:, slot]))
        if slot + 1 < num_slots:
            consumed = draft_ids[:, slot] if vocab_ids is None else vocab_ids[draft_ids[:, slot]]
            state = head.advance(consumed, state)
    faulty |= _long_and_prior_faults(long_logits, log_prior, draft_ids, pure_draft_prefix_len)
    return draft_ids, faulty


@torch.no_grad()
def dels_draft(long_logits: torch.Tensor, anchor_ids: torch.Tensor, head, log_prior: torch.Tensor,
               alpha: Schedule, beta: Schedule, *, pure_draft_prefix_len: int = 0,
               return_faulty: bool = False, vocab_ids: torch.Tensor | None = None):
    """Greedy DeLS drafting over the full vocabulary, or over a draft vocabulary: with
    vocab_ids [N] (ascending target ids), long_logits [B, S, N], head a SubVocabShortHead over
    them and log_prior [N], the returned ids index vocab_ids.

    long_logits [B, S, V] float, anchor_ids [B] int, head: GRUShortHead or MarkovShortHead,
    log_prior [V], alpha/beta: number or per-slot [S]. Returns int64 [B, S], or (ids, faulty
    bool [B]) with return_faulty (module docstring, Faults).
    Slots are committed left to right; alpha = beta = 0 gives exactly long_logits.argmax(-1).
    Each slot's fused argmax goes through the kernel dispatcher: one fused Triton pass over
    the vocabulary on CUDA (no [B, V] fused tensor), dels_fuse(...).argmax on CPU.
    """
    def pick(slot, long, short, alpha_s, beta_s):
        if short is None:
            return long.argmax(dim=-1)
        return dels_argmax(long, short, log_prior, alpha_s, beta_s)

    ids, faulty = _draft(long_logits, anchor_ids, head, log_prior, alpha, beta,
                         pure_draft_prefix_len, pick, vocab_ids)
    return (ids, faulty) if return_faulty else ids


@torch.no_grad()
def dels_draft_sampled(long_logits: torch.Tensor, anchor_ids: torch.Tensor, head,
                       log_prior: torch.Tensor, alpha: Schedule, beta: Schedule,
                       temperature: torch.Tensor | float, generator: torch.Generator | None = None,
                       *, pure_draft_prefix_len: int = 0, return_faulty: bool = False,
                       vocab_ids: torch.Tensor | None = None):
    """Sampled DeLS drafting.

    Slot s of request b draws d_s ~ softmax(fused_s / T_b), fused_s as in `dels_draft`; a row
    with T_b < GREEDY_TEMPERATURE (1e-5, vLLM's threshold; 0 and negative values included) is
    greedy and its distribution is the one-hot of the argmax.
    temperature: [B] (or a number). Returns (ids int64 [B, S], probs fp32 [B, S, V]),
    probs being exactly the distributions the ids were drawn from (what a lossless
    rejection sampler needs as the draft distribution q); with return_faulty also faulty
    bool [B] (module docstring, Faults). A row whose softmax is not finite (NaN or +inf
    scores) is drawn greedily, as in `walks.sampled_walk`, so probs are always finite and
    one bad row cannot make torch.multinomial fail the whole batch; such a row is faulty.
    vocab_ids: as in `dels_draft` (ids and probs then index the draft vocabulary).
    """
    batch, num_slots, vocab_size = _check_draft_inputs(long_logits, anchor_ids, head, log_prior)
    device = long_logits.device
    temperature = torch.as_tensor(temperature, dtype=torch.float32, device=device)
    if temperature.dim() == 0:
        temperature = temperature.expand(batch)
    if temperature.shape != (batch,):
        raise ValueError(f"temperature must be [B={batch}] or a number, got shape {tuple(temperature.shape)}")
    greedy = temperature < GREEDY_TEMPERATURE
    safe_temperature = torch.where(greedy, 1.0, temperature)[:, None]
    probs = torch.empty(batch, num_slots, vocab_size, dtype=torch.float32, device=device)

    def pick(slot, long, short, alpha_s, beta_s) -> torch.Tensor:
        fused = long.float() if short is None else dels_fuse(long, short, log_prior, alpha_s, beta_s)
        one_hot = F.one_hot(fused.argmax(dim=-1), vocab_size).float()
        slot_probs = torch.softmax(fused.float() / safe_temperature, dim=-1)
        use_soft = ~greedy[:, None] & torch.isfinite(slot_probs).all(dim=-1, keepdim=True)
        probs[:, slot] = torch.where(use_soft, slot_probs, one_hot)
        # A one-hot row can only draw its argmax, so greedy rows need no special path here.
        return torch.multinomial(probs[:, slot], 1, generator=generator)[:, 0]

    draft_ids, faulty = _draft(long_logits, anchor_ids, head, log_prior, alpha, beta,
                               pure_draft_prefix_len, pick, vocab_ids)
    return (draft_ids, probs, faulty) if return_faulty else (draft_ids, probs)


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
    _check_prefix_len(pure_draft_prefix_len)
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
    _check_prefix_len(pure_draft_prefix_len)
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
        faulty |= non_finite_rows(scores, chosen=_picked(scores, chosen))
        if slot + 1 < num_slots:
            state = head.advance(candidate_ids[rows, slot, chosen], state)
            scores = pairs[rows, slot, chosen].float()
    return (walk, faulty) if return_faulty else walk


@torch.no_grad()
def lattice_dels_walk(start: torch.Tensor, pairs: torch.Tensor, candidate_ids: torch.Tensor,
                      anchor_ids: torch.Tensor, head, log_prior: torch.Tensor, alpha: Schedule,
                      beta: Schedule, walk: str, *, pure_draft_prefix_len: int = 0) -> torch.Tensor:
    """Run `walk` ('greedy' | 'viterbi') on the lattice with the DeLS bonus -> int64 [B, S].

    Markov head: the pairwise terms plus `vllm_liliprop.walks`; GRU head: greedy only
    (`greedy_walk_with_short_head`); GRU with 'viterbi' raises LatticeDelsCombinationError.
    """
    check_lattice_dels_walk(walk, head)
    if not isinstance(head, MarkovShortHead):
        return greedy_walk_with_short_head(start, pairs, candidate_ids, anchor_ids, head, log_prior,
                                           alpha, beta, pure_draft_prefix_len=pure_draft_prefix_len)
    from vllm_liliprop.walks import greedy_walk, viterbi_walk

    start_bonus, pair_bonus = lattice_dels_terms_markov(
        candidate_ids, anchor_ids, head, log_prior, alpha, beta,
        pure_draft_prefix_len=pure_draft_prefix_len)
    walk_fn = greedy_walk if walk == "greedy" else viterbi_walk
    return walk_fn(start.float() + start_bonus, pairs.float() + pair_bonus)
