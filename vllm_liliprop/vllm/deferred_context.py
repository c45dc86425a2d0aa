"""The context K/V of plain steps, written when a draft next needs it instead of at every step.

A speculation schedule's plain step (k = 0) drafts nothing, yet the drafter's context K/V of the
step's new tokens must exist before any later draft attends over them. Writing it at once costs
the projection's fixed per-call overhead at every plain step: on SmolLM2 (2 CPU cores) a plain
step inside a speculative engine ran 1.02-1.07x a plain engine's step at batch 4-32
(testbed/smollm2/schedule), which caps a schedule that falls back to k = 0 under load below
plain decoding. So a plain step keeps the step's raw tap states, positions and KV slots here, and
the first pass that writes context again (a drafting step, or a plain step once `max_tokens` are
pending) writes them all in one projection, before its own.

The slots are only safe to write while their request holds its blocks: a request missing from a
step's batch (finished, preempted) may have had its blocks handed to another, so its pending
tokens are dropped (`keep_requests`, called with every step's batch before anything is written).
A request that comes back after that recomputes its context in its prefill.

A full KV block, though, may be kept by vLLM's prefix cache and served to a later request (a
conversation's next turn), drafter K/V included: dropped tokens there would leave that request's
drafts reading unwritten context (on SmolLM2 with the prefix cache's last block kept, tau 1.592
against 1.636). So a plain step that completes any request's KV block writes everything pending
(`must_write`): only tokens of a request's last, partial block are ever dropped, and vLLM caches
no partial block. Plain torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DeferredContext", "PendingContext", "context_slots", "request_rows"]


def request_rows(query_start_loc: torch.Tensor, num_tokens: int, device) -> torch.Tensor | None:
    """The row of each of a step's num_tokens context tokens in its batch, request b's tokens
    being query_start_loc[b]..[b + 1]; None where the tokens are not exactly the requests' (a
    padded batch), whose context is then written at once."""
    lengths = (query_start_loc[1:] - query_start_loc[:-1]).to(device)
    rows = torch.repeat_interleave(torch.arange(lengths.shape[0], device=device), lengths)
    return rows if rows.shape[0] == num_tokens else None


def context_slots(positions: torch.Tensor, rows: torch.Tensor, block_table: torch.Tensor,
                  block_size: int) -> torch.Tensor:
    """The KV slot [n] of each context token at `positions` [n] of request `rows` [n]: what
    vLLM's DFlash input kernel writes for the context, in a few vectorised ops instead of the
    kernel, which also lays out the queries a plain step never reads."""
    blocks = (positions // block_size).clamp(max=block_table.shape[1] - 1)
    return block_table[rows, blocks].to(torch.int64) * block_size + positions % block_size


@dataclass
class PendingContext:
    """One plain step's context tokens: raw target states [n, H], positions [n], KV slots [n],
    the row of each token's request [n] in that step's `req_ids`."""

    states: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    rows: torch.Tensor
    req_ids: list[str]


class DeferredContext:
    def __init__(self, max_tokens: int = 8192, kv_block_size: int | None = None):
        self.max_tokens = max_tokens
        self.kv_block_size = kv_block_size  # None: no block is ever kept by a prefix cache
        self._block_completed = False  # the last add() held the last token of a KV block
        self._pending: list[PendingContext] = []
        self._batch: list[str] = []  # the last batch keep_requests saw
        self.num_pending = 0  # tokens waiting for their K/V write
        self.num_deferred_tokens = 0  # context tokens whose K/V write was deferred
        self.num_dropped_tokens = 0  # of those, tokens dropped with their request

    def add(self, states, positions, slots, rows, req_ids: list[str],
            states_owned: bool = False) -> bool:
        """Keep a plain step's context (copies: vLLM reuses these buffers next step, though not
        states the caller built for this and owns: `states_owned`); rows [n] (request_rows)
        place each token's request in req_ids. False, keeping nothing, where the states are
        not one a token: the caller writes the context at once."""
        if states.shape[0] != positions.shape[0]:
            return False
        states = states if states_owned else states.clone()
        self._pending.append(PendingContext(states, positions.clone(), slots.clone(), rows,
                                            list(req_ids)))
        self._block_completed = bool(self.kv_block_size) and bool(
            ((positions + 1) % self.kv_block_size == 0).any())
        self.num_pending += int(positions.shape[0])
        self.num_deferred_tokens += int(positions.shape[0])
        return True

    def must_write(self) -> bool:
        """Whether the pending tokens must be written now: more than `max_tokens` of them, or the
        last add() completed a KV block that a prefix cache may serve to another request."""
        return self.num_pending > self.max_tokens or (self._block_completed and self.num_pending > 0)

    def keep_requests(self, req_ids: list[str]) -> None:
        """Drop the pending tokens of every request not in this step's batch. Called every
        step, so an unchanged batch (nobody left) returns at once."""
        unchanged, self._batch = req_ids == self._batch, list(req_ids)
        if unchanged or not self._pending:
            return
        present = set(req_ids)
        kept = []
        for entry in self._pending:
            here = [rid in present for rid in entry.req_ids]
            if all(here):
                kept.append(entry)
                continue
            mask = torch.tensor(here, device=entry.rows.device)[entry.rows]
            dropped = int((~mask).sum())
            self.num_dropped_tokens += dropped
            self.num_pending -= dropped
            if bool(mask.any()):
                kept.append(PendingContext(entry.states[mask], entry.positions[mask],
                                           entry.slots[mask], entry.rows[mask], entry.req_ids))
        self._pending = kept

    def take(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(states, positions, slots) of every pending token, oldest first, and forget them;
        None when nothing is pending."""
        pending, self._pending = self._pending, []
        self._block_completed = False
        if not pending:
            return None
        self.num_pending = 0
        return tuple(torch.cat([getattr(p, name) for p in pending])
                     for name in ("states", "positions", "slots"))
