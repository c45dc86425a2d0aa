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

__all__ = ["NO_DRAFT", "check_draft_length", "cut_drafts", "trim_rows"]

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


def trim_rows(rows: list[list[int]]) -> list[list[int]]:
    """Host drafts, each row cut at its first NO_DRAFT (token ids are never negative)."""
    return [row[: row.index(NO_DRAFT)] if NO_DRAFT in row else row for row in rows]
