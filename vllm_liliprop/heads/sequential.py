"""Sequential correction heads (DSpark's Markov head, Domino's recurrent head): the drafter's
block logits corrected slot by slot from the tokens drafted before each slot.

Notation: B requests (or M training blocks), S slots, n scored ids (the draft vocabulary), H the
drafter's width. Slot s scores id v as

    corrected_s(v) = base_s(v) + residual_s(v),   residual_s = head.step(state, prev_s, hidden_s)

where prev_s is the token committed just before slot s (the anchor for slot 0) and hidden_s the
drafter's final-normed state at the slot. A head implements

    init_state(batch, device)                       -> state
    step(state, prev_ids [B], hidden [B, H])        -> (residual [B, n], state)
    teacher_forced(prev_ids [M, S], hidden [M, S, H]) -> residual [M, S, n]

and `teacher_forced` equals running `step` over the slots with those prev ids (training uses it
with the ground truth; tests check the identity). prev ids are always target ids; with
`vocab_ids` (a reduced draft vocabulary, ascending target ids) scores index that vocabulary and
each drafted index is mapped to its target id before the head consumes it.

Ties: argmax takes the lowest index. Faults as in `rules/dels_draft.py` (faults.non_finite_rows).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from vllm_liliprop.faults import non_finite_rows
from vllm_liliprop.walks import GREEDY_TEMPERATURE

Pick = Callable[[int, torch.Tensor], torch.Tensor]


def argmax_pick(slot: int, scores: torch.Tensor) -> torch.Tensor:
    return scores.argmax(dim=-1)


def sampled_pick(temperature: torch.Tensor, probs: torch.Tensor,
                 generator: torch.Generator | None = None) -> Pick:
    """A pick that draws slot s of row b from softmax(scores / T_b) and writes that distribution
    to probs[:, s] (what a lossless rejection sampler needs as q). Rows with T_b below vLLM's
    greedy threshold, and rows whose softmax is not finite, take the argmax and a one-hot
    distribution, so probs stay finite and one bad row cannot fail the batch's multinomial."""
    temperature = temperature.float()
    greedy = temperature < GREEDY_TEMPERATURE
    safe = torch.where(greedy, 1.0, temperature)[:, None]

    def pick(slot: int, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.float()
        one_hot = torch.nn.functional.one_hot(scores.argmax(dim=-1), scores.shape[-1]).float()
        soft = torch.softmax(scores / safe, dim=-1)
        use_soft = ~greedy[:, None] & torch.isfinite(soft).all(dim=-1, keepdim=True)
        probs[:, slot] = torch.where(use_soft, soft, one_hot)
        return torch.multinomial(probs[:, slot], 1, generator=generator)[:, 0]

    return pick


@torch.no_grad()
def sequential_draft(base_logits: torch.Tensor, anchor_ids: torch.Tensor, hidden: torch.Tensor,
                     head, pick: Pick = argmax_pick, vocab_ids: torch.Tensor | None = None,
                     candidate_mask: torch.Tensor | None = None):
    """Commit the block left to right. base_logits [B, S, n], anchor_ids [B] (target ids),
    hidden [B, S, H]; candidate_mask [B, S, n] bool (optional): ids outside it score -inf (DSpark's
    top-k variant). Returns (ids int64 [B, S] indexing the n scored ids, faulty bool [B])."""
    batch, num_slots, _ = base_logits.shape
    if anchor_ids.shape != (batch,) or hidden.shape[:2] != (batch, num_slots):
        raise ValueError(f"anchor_ids must be [B={batch}] and hidden [B, S={num_slots}, H]; got "
                         f"{tuple(anchor_ids.shape)} and {tuple(hidden.shape)}")
    device = base_logits.device
    ids = torch.empty(batch, num_slots, dtype=torch.long, device=device)
    faulty = torch.zeros(batch, dtype=torch.bool, device=device)
    state = head.init_state(batch, device)
    prev = anchor_ids.long()
    for slot in range(num_slots):
        residual, state = head.step(state, prev, hidden[:, slot])
        scores = base_logits[:, slot].float() + residual.float()
        if candidate_mask is not None:
            scores = scores.masked_fill(~candidate_mask[:, slot], float("-inf"))
        ids[:, slot] = pick(slot, scores)
        faulty |= non_finite_rows(scores, chosen=scores.gather(-1, ids[:, slot, None]))
        prev = ids[:, slot] if vocab_ids is None else vocab_ids[ids[:, slot]]
    return ids, faulty
