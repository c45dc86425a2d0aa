"""How a step's drafts fared against the tokens the target then verified (plain torch).

A rule's health is best judged against what the same drafter's argmax would have drafted on the
same rows. After a verification step each request's sampled tokens reveal the verified
continuation after its anchor: the accepted drafts, then the target's own next token, padded
with -1 (vLLM's layout). A draft's accepted length is its prefix that equals that continuation;
a draft that was not sent to the target (the argmax's) is compared the same way, so both are
capped at what the step revealed and the argmax's count is a lower bound (it might have been
accepted further). Everything stays on the device: static shapes, no host reads.
"""

from __future__ import annotations

import torch

# The order of `verified_tally`'s counts.
TALLY_FIELDS = ("verified_rows", "accepted_tokens", "argmax_accepted_tokens")


def accepted_prefix_lengths(drafts: torch.Tensor, verified: torch.Tensor) -> torch.Tensor:
    """[B] int64: how many leading tokens of drafts [B, S] equal verified [B, W] (-1 = not
    revealed, which no draft equals); at most min(S, W)."""
    width = min(drafts.shape[1], verified.shape[1])
    same = drafts[:, :width].long() == verified[:, :width].long()
    return same.long().cumprod(dim=-1).sum(dim=-1)


def verified_tally(rule_drafts: torch.Tensor, argmax_drafts: torch.Tensor, verified: torch.Tensor,
                   usable: torch.Tensor) -> torch.Tensor:
    """[3] int64, as `TALLY_FIELDS`: rows compared, the rule's accepted tokens, the argmax's.

    rule_drafts / argmax_drafts [B, S]: the drafts of the previous step, row-aligned with
    verified [B, W] (this step's sampled tokens, -1 padded). usable [B] bool: rows whose
    previous drafts belong to this verification. A row is also left out when its accepted
    tokens are not the rule's drafts (the rule's prefix covers fewer than the n - 1 accepted
    of n revealed tokens): then what the target verified was not what this rule drafted (a
    stale draft of a skipped step, drafts replaced by the scheduler).
    """
    revealed = (verified >= 0).long().sum(dim=-1)
    rule = accepted_prefix_lengths(rule_drafts, verified)
    argmax = accepted_prefix_lengths(argmax_drafts, verified)
    keep = (usable & (revealed > 0) & (rule >= revealed - 1)).long()
    return torch.stack([keep.sum(), (rule * keep).sum(), (argmax * keep).sum()])
