"""Row argmax of logits on a CPU at the cost of one copy.

A fresh full-vocabulary fp32 tensor per step pays its page faults (measured on 2 cores: 6.9 ms
to cast [64, 49152] bf16 logits into a new tensor, 0.9 ms to copy them into an existing one),
and torch's CPU argmax is ~3x slower than vLLM's `greedy_argmax` op, the one plain decoding
samples with on CPU. So rows are copied into a buffer kept between steps and reduced there.
Ties go to the first maximum, as with torch's argmax. Off CPU, or in a vLLM build without the
op: torch's argmax.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["row_argmax"]

_buffers: dict[int, torch.Tensor] = {}


@functools.cache
def _cpu_op():
    # vLLM's CPU wheel ships one kernel library per ISA (_C, _C_AVX512, _C_AVX2), each
    # registering torch.ops._C; its platform loads the host's. Importing `vllm._C` by name
    # loaded the AVX512-BF16 build beside the AVX2 one on an AVX2-only host, and torch aborts
    # the process on the second registration. `_custom_ops` loads them as vLLM does.
    try:
        import vllm._custom_ops  # noqa: F401
        return getattr(torch.ops._C, "greedy_argmax", None)
    except (ImportError, AttributeError, RuntimeError):
        return None


def _fp32_rows(logits: torch.Tensor) -> torch.Tensor:
    if logits.dtype == torch.float32 and logits.is_contiguous():
        return logits
    rows, width = logits.shape
    buffer = _buffers.get(width)
    if buffer is None or buffer.shape[0] < rows:  # grown, never shrunk
        buffer = _buffers[width] = torch.empty(rows, width, dtype=torch.float32)
    return buffer[:rows].copy_(logits)


def row_argmax(logits: torch.Tensor) -> torch.Tensor:
    """[N, V] logits -> [N] int64, the index of each row's maximum."""
    if logits.device.type != "cpu":
        return logits.argmax(dim=-1)
    op = _cpu_op()
    rows = _fp32_rows(logits)
    return rows.argmax(dim=-1) if op is None else op(rows)
