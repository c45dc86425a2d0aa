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

__all__ = ["cpu_model_and_flags", "cpu_bf16_matmul_speedup", "BF16_MIN_SPEEDUP", "fast_dtype"]

# bf16 also costs casts (autocast keeps fp32 master weights; vLLM's CPU kernels convert around
# some ops): below this matmul speed ratio it does not pay. An Intel host without AMX runs bf16
# matmul at 0.8x fp32 (a SmolLM2 DFlash training step 6.1 s in bf16 autocast against 3.3 s in
# fp32), an AMD EPYC without AVX512-BF16 at 0.01x (a served DFlash step 139.5 ms in bf16,
# issue 34), an AMD EPYC with it at 2.3-4x, an Intel host with AMX at 4.3x.
BF16_MIN_SPEEDUP = 1.3


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


def fast_dtype(device_type: str = "cpu") -> str:
    """The dtype a model runs fastest in here, by measurement: "bfloat16" on CUDA and on a CPU
    whose bf16 matmul is at least BF16_MIN_SPEEDUP times fp32, else "float32"."""
    if device_type == "cuda" or cpu_bf16_matmul_speedup() >= BF16_MIN_SPEEDUP:
        return "bfloat16"
    return "float32"


if __name__ == "__main__":  # python -m vllm_liliprop.host: the serving dtype, for scripts
    import sys

    print(fast_dtype())
    print(f"[host] bf16 matmul {cpu_bf16_matmul_speedup():.2f}x fp32 on {cpu_model_and_flags()[0]}", file=sys.stderr)
