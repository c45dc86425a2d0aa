"""The context K/V of plain steps, written when a draft next needs it instead of at every step.

A speculation schedule's plain step (k = 0) drafts nothing, yet the drafter's context K/V of the
step's new tokens must exist before any later draft attends over them. Writing it at once costs
the projection's fixed per-call overhead at every plain step: on SmolLM2 (2 CPU cores) a plain
step inside a speculative engine ran 1.02-1.07x a plain engine's step at batch 4-32
(testbed/smollm2/schedule), which caps a schedule that falls back to k = 0 under load below
plain decoding. So a plain step keeps the step's raw tap states, positions and KV slots here, and
the first pass that writes context again (a drafting step, or a plain step once `max_tokens` are
pending) writes them all in one projection, before its own.

The slots are only safe to write while their request holds its blocks. When a request leaves
(finished, preempted, or missing from a step's batch: `depart`, `keep_requests`), its pending
tokens in its last, partial KV block are dropped: vLLM caches no partial block, and a request
that comes back recomputes it. Its tokens in full blocks, though, may be served by vLLM's prefix
cache to a later request (a conversation's next turn), drafter K/V included, and a draft over
unwritten context is a worse draft (on SmolLM2, tau 1.592 against 1.636 for second turns). They
are parked by KV block instead:
- a step whose scheduler output shows a prefix-cache hit (`hit_blocks`) returns the parked
  tokens of the blocks hit for an immediate write, and makes the step write all that is pending
  (`must_write`), so the hitting request's drafts read what a write at once would have left;
- a parked block that the scheduler hands to a request (`forget_blocks`) is dropped: its slots
  are the new owner's now;
- parked states beyond `max_parked_bytes` (64 MiB: ~11,600 tokens of SmolLM2's five bf16 taps)
  are dropped oldest block first: raw taps are several times the drafter's K/V a token. A
  later hit on such a block drafts over unwritten context: output is still the target's,
  drafts are worse.
Until this, every plain step that completed a KV block wrote everything pending, so a k = 0
engine projected every prompt's full blocks, which no request may ever read (at batch 16 with
~150-token prompts, ~1.5% of the step time on 2 cores). Plain torch.
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


Context = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (states, positions, slots)


class DeferredContext:
    def __init__(self, max_tokens: int = 8192, kv_block_size: int | None = None,
                 max_parked_bytes: int = 64 << 20):
        self.max_tokens = max_tokens
        self.kv_block_size = kv_block_size  # None: no block is ever kept by a prefix cache
        self.max_parked_bytes = max_parked_bytes
        self._hit = False  # this step's scheduler output showed a prefix-cache hit
        self._pending: list[PendingContext] = []
        self._parked: dict[int, list[Context]] = {}  # KV block id -> its tokens, oldest block first
        self._batch: list[str] = []  # the requests pending tokens may belong to
        self.num_pending = 0  # tokens waiting for their K/V write
        self.num_parked = 0  # tokens of departed requests' full blocks, kept for a prefix hit
        self.num_parked_bytes = 0  # their states' bytes
        self.num_deferred_tokens = 0  # context tokens whose K/V write was deferred
        self.num_dropped_tokens = 0  # of those, tokens never written
        self.num_revived_tokens = 0  # of those, parked tokens written for a prefix hit

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
        self.num_pending += int(positions.shape[0])
        self.num_deferred_tokens += int(positions.shape[0])
        return True

    def must_write(self) -> bool:
        """Whether the pending tokens must be written now: more than `max_tokens` of them, or
        this step's scheduler output showed a prefix-cache hit (`hit_blocks`)."""
        return self.num_pending > self.max_tokens or (self._hit and self.num_pending > 0)

    def keep_requests(self, req_ids: list[str]) -> None:
        """Let go of the pending tokens of every request not in this step's batch (`depart`).
        Called every step, so an unchanged batch returns at once."""
        if req_ids != self._batch:
            present = set(req_ids)
            self.depart({rid for entry in self._pending for rid in entry.req_ids if rid not in present})
        self._batch = list(req_ids)

    def depart(self, gone: set[str]) -> None:
        """Requests that left (finished, preempted, or out of the batch): their pending tokens in
        full KV blocks parked, the rest dropped (see the module). The masks come from a few
        vector ops over every pending token; states are copied only where an entry changes."""
        self._batch = [rid for rid in self._batch if rid not in gone]
        names = list(dict.fromkeys(rid for entry in self._pending for rid in entry.req_ids))
        if not any(rid in gone for rid in names):
            return
        device = self._pending[0].rows.device
        index = {rid: i for i, rid in enumerate(names)}
        owner = torch.cat([torch.tensor([index[rid] for rid in entry.req_ids], device=device)[entry.rows]
                           for entry in self._pending])
        leaves = torch.tensor([rid in gone for rid in names], device=device)[owner]
        positions = torch.cat([entry.positions for entry in self._pending])
        park = leaves & (positions < self._full_block_ends(owner, positions, len(names)))
        sizes = [entry.positions.shape[0] for entry in self._pending]
        kept, parked = [], []
        for entry, leave, keep in zip(self._pending, leaves.split(sizes), park.split(sizes)):
            if not bool(leave.any()):  # an entry its leavers had left already
                kept.append(entry)
                continue
            if bool(keep.any()):
                parked.append((entry.states[keep], entry.positions[keep], entry.slots[keep]))
            stay = ~leave
            if bool(stay.any()):
                kept.append(PendingContext(entry.states[stay], entry.positions[stay], entry.slots[stay],
                                           entry.rows[stay], entry.req_ids))
        num_leaving, num_parked = int(leaves.sum()), int(park.sum())
        self.num_dropped_tokens += num_leaving - num_parked
        self.num_pending -= num_leaving
        self._pending = kept
        if parked:
            self._park(*(torch.cat(parts) for parts in zip(*parked)))
            self._bound_parked()

    def _full_block_ends(self, owner, positions, num_requests: int) -> torch.Tensor:
        """[n] the first position past the last full KV block of each token's request (0 without
        a prefix cache: nothing is parked). A request's pending tokens are the latest it
        computed, so the last of them is where its KV blocks end."""
        if not self.kv_block_size:
            return torch.zeros_like(positions)
        latest = torch.full((num_requests,), -1, dtype=positions.dtype, device=positions.device)
        latest = latest.scatter_reduce(0, owner, positions, "amax")
        return ((latest + 1) // self.kv_block_size * self.kv_block_size)[owner]

    def _park(self, states, positions, slots) -> None:
        """Departed tokens filed by KV block: a view of each run of one block's tokens (a
        request's tokens of a step are contiguous, so a prompt's block is one run)."""
        ids, counts = torch.unique_consecutive(slots // self.kv_block_size, return_counts=True)
        counts = counts.tolist()
        for block, *part in zip(ids.tolist(), states.split(counts), positions.split(counts),
                                slots.split(counts)):
            self._parked.setdefault(block, []).append(tuple(part))
        self._count_parked(states, +1)

    def _count_parked(self, states: torch.Tensor, sign: int) -> None:
        self.num_parked += sign * int(states.shape[0])
        self.num_parked_bytes += sign * states.numel() * states.element_size()

    def _bound_parked(self) -> None:
        # Parked parts are views of one copy per departure, freed with the last of its blocks.
        while self.num_parked_bytes > self.max_parked_bytes:
            oldest = next(iter(self._parked))
            self._drop_parked(oldest)

    def _drop_parked(self, block: int) -> None:
        for states, _, _ in self._parked.pop(block):
            self._count_parked(states, -1)
            self.num_dropped_tokens += int(states.shape[0])

    def drop_parked(self) -> None:
        """Drop every parked block (where the scheduler's blocks could not be followed)."""
        for block in list(self._parked):
            self._drop_parked(block)

    def forget_blocks(self, block_ids) -> None:
        """KV blocks the scheduler just handed to a request: their parked tokens are dropped."""
        for block in block_ids:
            if block in self._parked:
                self._drop_parked(block)

    def hit_blocks(self, block_ids) -> Context | None:
        """A step whose requests hit these KV blocks in the prefix cache: the parked tokens of
        those blocks, to be written now, and every pending token written by this step."""
        self._hit = True
        parts = [part for block in block_ids for part in self._parked.pop(block, ())]
        if not parts:
            return None
        revived = tuple(torch.cat([part[i] for part in parts]) for i in range(3))
        self._count_parked(revived[0], -1)
        self.num_revived_tokens += int(revived[1].shape[0])
        return revived

    def take(self) -> Context | None:
        """(states, positions, slots) of every pending token, oldest first, and forget them;
        None when nothing is pending."""
        pending, self._pending = self._pending, []
        self._hit = False
        if not pending:
            return None
        self.num_pending = 0
        return tuple(torch.cat([getattr(p, name) for p in pending])
                     for name in ("states", "positions", "slots"))
