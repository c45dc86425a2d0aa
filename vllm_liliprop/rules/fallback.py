"""What the proposer does with rows a rule could not score, without a host synchronization.

A rule flags rows whose scores were unusable (`DraftOutput.faulty_rows`); those rows get the
drafter's own argmax instead. The draft step runs once per engine step, so neither the
replacement nor the bookkeeping may read a device value on the host: the replacement is a
`torch.where` over the whole batch (whether or not any row is flagged), and the fault count
stays on the device, reaching the host through a non-blocking copy whose completion is polled
on later steps (device_tally.py). The first report logs one warning; `FaultCounter.total` syncs,
and is meant for tests and end-of-run summaries, not the draft step.
"""

from __future__ import annotations

from typing import Callable

import torch

from vllm_liliprop.device_tally import DeviceTally
from vllm_liliprop.rules.base import DraftInputs, DraftOutput, argmax_drafts


def check_output_shape(inputs: DraftInputs, output: DraftOutput) -> None:
    expected = (inputs.batch_size, inputs.num_slots)
    if tuple(output.token_ids.shape) != expected:
        raise ValueError(
            f"rule returned drafts of shape {tuple(output.token_ids.shape)}, expected {expected}"
        )


def apply_fallback(inputs: DraftInputs, output: DraftOutput) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(token_ids [B, S], probs [B, S, V] | None) with every faulty row replaced by the drafter's
    argmax (and its one-hot distribution). Static shapes, no host reads: CUDA-graph friendly.

    Rules that flag rows should also return `fallback_ids` (the lattice rules hand over their
    top-1 candidates, which are the argmax); otherwise the argmax is recomputed here from the
    drafter's logits, one extra full-vocabulary projection per step.
    """
    check_output_shape(inputs, output)
    token_ids, probs = output.token_ids, output.probs
    if output.faulty_rows is None:
        return token_ids, probs
    fallback = output.fallback_ids if output.fallback_ids is not None else argmax_drafts(inputs)
    return replace_rows(token_ids, probs, output.faulty_rows.to(torch.bool), fallback)


def replace_rows(token_ids: torch.Tensor, probs: torch.Tensor | None, rows: torch.Tensor,
                 ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Drafts [B, S] (and distributions [B, S, V]) with the rows flagged in `rows` [B] replaced
    by `ids` [B, S], each replaced slot's distribution one-hot at its token: the rejection
    sampler then treats it as the deterministic draft it is. No host reads."""
    ids = ids.to(token_ids.device, token_ids.dtype)
    rows = rows.to(token_ids.device)
    token_ids = torch.where(rows[:, None], ids, token_ids)
    if probs is not None:
        # One pass over [B, S, V]: clear the replaced rows (NaN included), then put their mass
        # on the new token; other rows get + 0 there.
        probs = probs.masked_fill(rows[:, None, None], 0.0)
        mass = rows.to(probs.dtype)[:, None, None].expand(*ids.shape, 1)
        probs.scatter_add_(-1, ids.long().unsqueeze(-1), mass)
    return token_ids, probs


class FaultCounter:
    """Draft rows that fell back, and draft steps with at least one, kept on the device.

    `add(faulty_rows)` never waits for the device (a `DeviceTally`), so `on_first_fault(count)`
    fires a step or two after the first fault on CUDA, never mid-step, and `settled()` (what
    vLLM's metrics export) lags the device by as much.
    """

    def __init__(self, on_first_fault: Callable[[int], None]):
        self._on_first_fault = on_first_fault
        self._tally = DeviceTally(2)  # [rows, steps]
        self._reported = False

    def add(self, faulty_rows: torch.Tensor) -> None:
        faulty = faulty_rows.to(torch.int64)
        self._tally.add(torch.stack([faulty.sum(), faulty.amax() if faulty.numel() else faulty.sum()]))
        if not self._reported:
            self._report(self.settled()[0])

    @property
    def total(self) -> int:
        """All faulty rows so far. Synchronizes with the device: not for the draft step."""
        return self._tally.total()[0]

    def settled(self) -> tuple[int, int]:
        """(faulty rows, steps with a faulty row) as far as the host has seen them, without
        waiting: exact off CUDA; on CUDA as of the last completed copy."""
        return self._tally.settled()

    def _report(self, count: int) -> None:
        if count > 0 and not self._reported:
            self._reported = True
            self._on_first_fault(count)
