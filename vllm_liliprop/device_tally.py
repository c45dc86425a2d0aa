"""Counts kept on the device and read on the host without waiting for it (plain torch).

The draft step runs once per engine step and must never read a device value on the host (a
synchronization would stall the step on CUDA). A `DeviceTally` adds a small int64 vector on the
device each step; on CUDA the running sums are copied to pinned host memory behind an event,
and `settled()` returns the last copy that has completed: exact off CUDA, a step or two behind
on CUDA. `total()` waits for the device and is meant for tests and end-of-run summaries.
"""

from __future__ import annotations

import torch


class DeviceTally:
    def __init__(self, size: int):
        self.size = size
        self._device_sums: torch.Tensor | None = None
        self._host_copy: torch.Tensor | None = None
        self._copy_done = None
        self._settled = (0,) * size

    def add(self, counts: torch.Tensor) -> None:
        """counts: [size] integers on the device the draft step runs on."""
        if self._device_sums is None:
            self._device_sums = torch.zeros(self.size, dtype=torch.int64, device=counts.device)
        self._device_sums += counts.to(torch.int64)

    def total(self) -> tuple[int, ...]:
        """The exact sums so far. Synchronizes with the device: not for the draft step."""
        if self._device_sums is None:
            return (0,) * self.size
        return tuple(int(v) for v in self._device_sums.tolist())

    def settled(self) -> tuple[int, ...]:
        """The sums as far as the host has seen them, without waiting: exact off CUDA; on CUDA
        as of the last completed copy (each call starts the next copy)."""
        if self._device_sums is None:
            return self._settled
        if self._device_sums.device.type != "cuda":
            return self.total()  # host memory: reading it waits for nothing
        if self._copy_done is not None:
            if not self._copy_done.query():
                return self._settled
            self._settled = tuple(int(v) for v in self._host_copy.tolist())
        if self._host_copy is None:
            self._host_copy = torch.zeros(self.size, dtype=torch.int64, pin_memory=True)
        self._host_copy.copy_(self._device_sums, non_blocking=True)
        self._copy_done = torch.cuda.Event()
        self._copy_done.record()
        return self._settled
