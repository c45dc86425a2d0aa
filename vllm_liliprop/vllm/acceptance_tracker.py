"""Per rule, how its drafts fare against the drafter's argmax on the same rows, step by step.

The proposer hands this tracker, each engine step:
1. `verify` (from `prepare_next_token_ids_padded`, which vLLM's runner calls right before
   `propose`):
   the tokens the target just sampled per request (the verified continuation) and the
   requests' ids in batch order; the drafts remembered at the previous step are compared with
   them (verified_acceptance.py) and the counts added on the device;
2. `remember` (from `_sample_draft_tokens`): the rule's drafts and the drafter's argmax drafts
   of this step, rows in the order `verify` just saw.
Requests are matched across steps by id (vLLM reorders and condenses its batch); when the order
did not change, which is the common case, rows are used as they are and nothing is copied. A
changed order costs one small host-to-device copy of row indices, non-blocking: the step never
waits for the device. Requests whose sampled token vLLM discards (a chunked prefill) are left
out, at the step they were drafted and at the step they were verified.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from vllm.utils.torch_utils import async_tensor_h2d

from vllm_liliprop.device_tally import DeviceTally
from vllm_liliprop.verified_acceptance import TALLY_FIELDS, verified_tally


@dataclass
class _StepDrafts:
    rule: torch.Tensor  # [B, S]
    argmax: torch.Tensor  # [B, S]
    usable: torch.Tensor  # [B] bool: the row's anchor was a real token
    req_ids: list[str]


@dataclass
class _StepBatch:
    usable: torch.Tensor
    req_ids: list[str]


class AcceptanceTracker:
    def __init__(self):
        self.tally = DeviceTally(len(TALLY_FIELDS))
        self._drafts: _StepDrafts | None = None
        self._batch: _StepBatch | None = None

    def verify(self, sampled: torch.Tensor, usable: torch.Tensor, req_ids: list[str]) -> None:
        """sampled [B, W]: this step's tokens per request, -1 past the verified ones; usable [B]
        bool: rows whose sampled tokens are real (not discarded); req_ids: the batch's order."""
        drafts, self._drafts = self._drafts, None
        self._batch = _StepBatch(usable, list(req_ids))
        if drafts is None:
            return
        rows = previous_rows(drafts.req_ids, req_ids, sampled.device)
        if rows is None:
            prev = (drafts.rule, drafts.argmax, drafts.usable)
            usable = usable & prev[2]
        else:
            index = rows.clamp_min(0)
            prev = (drafts.rule[index], drafts.argmax[index], drafts.usable[index])
            usable = usable & prev[2] & (rows >= 0)
        self.tally.add(verified_tally(prev[0], prev[1], sampled, usable))

    def remember(self, rule_drafts: torch.Tensor, argmax_drafts: torch.Tensor) -> None:
        """This step's drafts, [B, S] each, rows in the order of the last `verify`."""
        batch, self._batch = self._batch, None
        if batch is None or len(batch.req_ids) != rule_drafts.shape[0]:
            return  # no verify this step (a dummy run): nothing to pair the rows with
        self._drafts = _StepDrafts(rule_drafts, argmax_drafts, batch.usable, batch.req_ids)


def previous_rows(before: list[str], now: list[str], device) -> torch.Tensor | None:
    """[B] int64 on `device`: each current request's row in `before` (-1: absent); None when
    the order is unchanged."""
    if now == before:
        return None
    where = {req_id: row for row, req_id in enumerate(before)}
    return async_tensor_h2d([where.get(req_id, -1) for req_id in now], device, torch.int64)

