"""DeLS-Spec drafting over the drafter's vocabulary, slot by slot (greedy or sampled).

Notation: B requests, S = num_speculative_tokens slots, V vocabulary; `anchor_ids[B]` is the
last verified token of each request. The committed prefix of slot s is (anchor, d_0, ...,
d_{s-1}) where d_t is the token committed at slot t. The one formula (`heads/dels.py`): slot s
scores token v as

    long_s(v) + alpha_s * log p_S(v | prefix_s) - beta_s * log_prior(v)

with log p_S = log_softmax of the short head's logits. `dels_draft` takes the argmax over the
vocabulary (through the kernel dispatcher: one fused Triton pass on CUDA); `dels_draft_sampled`
samples from softmax(score / T). The same bonus on a LiLiCorr lattice is `heads/dels_lattice.py`.

pure_draft_prefix_len P (0 or 1, a field of the DeLS config): P = 0 is this project's rule,
every slot is corrected and the short head reads the anchor first. P = 1 reproduces the
public DeLS-Spec runtime, which its released heads were trained for: slot 0 is drafted from
the long scores alone and the short prefix starts at d_0, without the anchor.

Ties: every argmax takes the lowest index (lowest token id).

Faults: with `return_faulty=True` the drafting functions also return a [B] bool of the rows
whose scores were unusable (`vllm_liliprop.faults.non_finite_rows`: NaN or +inf in a score, or
a drafted token that scored -inf or NaN), computed on the device, so the caller can fall back
for those rows without a host read. -inf scores alone (a reduced draft vocabulary) are fine.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm_liliprop.faults import non_finite_rows
from vllm_liliprop.heads.dels import Schedule, check_prefix_len, dels_fuse, slot_schedule
from vllm_liliprop.kernels import dels_argmax
from vllm_liliprop.walks import GREEDY_TEMPERATURE


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
    check_prefix_len(pure_draft_prefix_len)
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
