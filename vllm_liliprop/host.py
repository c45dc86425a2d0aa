"""What the CPU this process runs on can do: /proc/cpuinfo, and bf16 against fp32 matmul speed.

The 2-core machines this project runs on come in kinds whose bf16 speed differs by 7x
(matmul, 2 threads): an Intel host with AMX about 930 GFLOPS bf16 (fp32 214); an Intel host
whose hypervisor hides AMX 132 (fp32 162); an AMD EPYC with AVX512-BF16 396 (fp32 171). The
flags do not tell the last two apart (both have avx512_bf16), so whether bf16 pays is measured.
"""

from __future__ import annotations

import functools
import platform
import time

import torch

__all__ = ["cpu_model_and_flags", "cpu_bf16_matmul_speedup"]


def cpu_model_and_flags(path: str = "/proc/cpuinfo") -> tuple[str, set[str]]:
    """(model name, instruction-set flags) of the first processor; ("<platform>", set()) where
    /proc/cpuinfo cannot be read."""
    model, flags = "", set()
    try:
        with open(path) as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not model:
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), flags


@functools.cache  # about 0.1 s, once per process
def cpu_bf16_matmul_speedup(size: int = 768, repeats: int = 4) -> float:
    """How many times faster a bf16 matmul runs than fp32 on this CPU at the current thread count
    (best of `repeats` for each, after a warm-up: the machines are shared and noisy)."""

    def best_seconds(dtype):
        a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
        a @ b
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        return min(times)

    return best_seconds(torch.float32) / best_seconds(torch.bfloat16)
