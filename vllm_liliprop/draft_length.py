"""Drafts shorter than k: a request's draft ends where it stops paying, marked in the block.

vLLM's DFlash path drafts k slots for every request, and the target then verifies all k. Where a
draft is long only sometimes (a prompt lookup's continuation, which is often right for many
tokens, beside a drafter's block, which rarely is past its first few), a fixed k either wastes
verify work on the drafter's rows or caps the lookup's. A slot set to `NO_DRAFT` ends its
request's draft: the runner's host copy of the drafts is cut there (vllm/patching.py, patch 10)
before the scheduler reads it, so the scheduler schedules, and the target verifies, only the
tokens before it, as it does for vLLM's n-gram proposer's variable-length drafts.

That holds where vLLM hands drafts to the scheduler as host lists: without async scheduling
(always on vLLM's CPU platform). With async scheduling the runner writes the drafts straight
into the next step's input on the device, where -1 would be read as a token id; the proposer
refuses the option there (vllm/proposer.py). Plain torch, no vLLM.
"""

from __future__ import annotations

import torch

__all__ = ["NO_DRAFT", "check_draft_length", "cut_drafts", "trim_rows", "rule_slots", "pad_drafts",
           "short_block_advice", "queried_masks", "kept_length", "check_confidence_floor", "confident_cut"]

NO_DRAFT = -1


def check_draft_length(value, where: str) -> int:
    """A draft length option: an integer >= 0; ValueError naming `where` and the fix."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{where} = {value!r} must be an integer >= 0 (the number of the draft "
                         "rule's slots kept, e.g. 3; 0 drafts only where the lookup finds a match)")
    return value


def cut_drafts(token_ids: torch.Tensor, length: int,
               keep: torch.Tensor | None = None) -> torch.Tensor:
    """Drafts [B, S] with every slot from `length` on set to NO_DRAFT, except in the rows
    flagged in `keep` [B] bool (drafts kept whole). No host reads."""
    if length >= token_ids.shape[1]:
        return token_ids
    cut = torch.zeros(token_ids.shape, dtype=torch.bool, device=token_ids.device)
    cut[:, length:] = True
    if keep is not None:
        cut &= ~keep.to(token_ids.device)[:, None]
    return token_ids.masked_fill(cut, NO_DRAFT)


def check_confidence_floor(value, where: str) -> float:
    """A confidence floor: a number strictly between 0 and 1; ValueError naming `where` and the fix."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 < value < 1.0
    if not ok:
        raise ValueError(f"{where} = {value!r} must be a number between 0 and 1 (exclusive): the "
                         "probability below which a greedy draft stops, e.g. 0.06")
    return float(value)


def confident_cut(token_ids: torch.Tensor, confidence: torch.Tensor, floor: float,
                  temperature: torch.Tensor | None) -> torch.Tensor:
    """Drafts [B, S] with each greedy row cut where the drafter's probability that its draft is
    right so far (the product of its slots' `confidence` [B, S]) falls below `floor`.

    A verified slot costs the target a query row whether or not it is accepted; with a
    calibrated drafter, the product is the chance the slot is reached and accepted, so the cut
    drops the slots that would cost more than they yield (docs/serving.md, `draft_confidence_floor`).
    Greedy rows only (temperature [B], None: all greedy): greedy verification compares tokens,
    so any cut is lossless there, while cutting a sampled draft on its own tokens' probabilities
    would bias rejection sampling. A non-finite confidence cuts nothing (the fallback's
    draft stands). No host reads."""
    reach = torch.cumprod(torch.nan_to_num(confidence.float(), nan=1.0, posinf=1.0, neginf=1.0), dim=1)
    cut = reach < floor
    if temperature is not None:
        cut &= (temperature[: token_ids.shape[0]] <= 0).to(cut.device)[:, None]
    return token_ids.masked_fill(cut.to(token_ids.device), NO_DRAFT)


def rule_slots(num_slots: int, length: int | None) -> int:
    """How many of a block's `num_slots` slots the rule has to draft: the first `length` where
    the rest are cut anyway. The drafter still runs over the whole block (k = block_size - 1
    queries is the layout it was trained on; a shorter block drafts worse, docs/serving.md),
    but the rule's LM head and head run only over the slots vLLM will verify. At least one:
    a head needs a slot to score, and with length 0 (lookups only) `cut_drafts` drops it."""
    return num_slots if length is None else min(num_slots, max(length, 1))


def queried_masks(k: int, max_k: int, block_size: int) -> int:
    """How many masks to query for a step that verifies k drafts: the drafter's trained block
    (block_size - 1 masks), capped at the configured `max_k` that vLLM sized its buffers and KV
    lookahead for, and never fewer than k. A speculation schedule picks a k per batch size;
    a k below the block would query a shorter block than the drafter was trained on, which
    drafts worse (short_block_advice), so the block stays and only its first k are verified.
    k = 0 (a plain step) queries nothing."""
    if k == 0 or block_size < 2:
        return k
    return max(k, min(max_k, block_size - 1))


def kept_length(rule_draft_length: int | None, verified: int, slots: int) -> int | None:
    """The slots of a block of `slots` that a step keeps: `rule_draft_length` where set, and no
    more than the `verified` k a schedule picked where the block was queried longer
    (queried_masks). None where every slot is kept."""
    limits = [n for n in (rule_draft_length, verified if verified < slots else None) if n is not None]
    return min(limits) if limits else None


def short_block_advice(block_size: int, k: int, rule_draft_length: int | None) -> str | None:
    """Why and how to serve a DFlash drafter at its trained block, or None where it already is.

    vLLM's DFlash path queries [anchor, mask x k]. A drafter trained on blocks of `block_size`
    attends over all of its block's queries, so a shorter block is an input it never saw: on
    SmolLM2's round-3 drafter, k = 3 instead of 7 queries cost 6% of served tau at the same 3
    verified tokens (docs/serving.md)."""
    if block_size < 2 or k <= 0 or k >= block_size - 1:
        return None
    kept = k if rule_draft_length is None else rule_draft_length
    return (f"num_speculative_tokens = {k} queries a block of {k + 1} from a drafter trained on "
            f"blocks of {block_size}, which drafts worse; serve num_speculative_tokens = "
            f"{block_size - 1} with liliprop rule_draft_length = {kept}: the drafter then queries "
            f"its trained block and vLLM still verifies {kept} tokens a step")


def pad_drafts(token_ids: torch.Tensor, probs: torch.Tensor | None,
               num_slots: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A rule's drafts [B, L] (and distributions [B, L, V]) widened to the block's `num_slots`
    slots: NO_DRAFT tokens and zero distributions in the slots it did not draft, which the
    runner cuts before anything reads them. No host reads."""
    missing = num_slots - token_ids.shape[1]
    if missing <= 0:
        return token_ids, probs
    token_ids = torch.nn.functional.pad(token_ids, (0, missing), value=NO_DRAFT)
    if probs is not None:
        probs = torch.nn.functional.pad(probs, (0, 0, 0, missing))
    return token_ids, probs


def trim_rows(rows: list[list[int]]) -> list[list[int]]:
    """Host drafts, each row cut at its first NO_DRAFT (token ids are never negative)."""
    return [row[: row.index(NO_DRAFT)] if NO_DRAFT in row else row for row in rows]
