"""The machine a measurement ran on, as a results column.

The same 2-core machine kind has run plain decoding of SmolLM2 at 18 and at 85 tokens/s on
different days: the host kind decides bf16 matmul speed (930 GFLOPS with AMX, 132 on an
Intel host without it, 396 on an AMD EPYC with AVX512-BF16), so every speed figure is only
comparable within one kind of CPU. The record names the CPU, the cores, the matrix instruction
sets the kernels can use and the measured bf16 : fp32 matmul speed (the flags alone do not tell
the two hosts without AMX apart).
"""

from __future__ import annotations

import json
import os

import torch

from vllm_liliprop.host import cpu_bf16_matmul_speedup, cpu_model_and_flags

__all__ = ["machine_record"]

# The instruction sets that decide the CPU kernels' speed (oneDNN picks AMX > AVX512-BF16 > AVX2).
ISA_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2")


def machine_record(cpuinfo_path: str = "/proc/cpuinfo") -> str:
    """JSON: {"cpu", "cores" (usable by this process), "isa" (those of ISA_FLAGS present),
    "bf16_speedup" (bf16 over fp32 matmul, measured once per process), "gpu"}."""
    model, flags = cpu_model_and_flags(cpuinfo_path)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 0
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    return json.dumps({"cpu": model, "cores": cores, "isa": [f for f in ISA_FLAGS if f in flags],
                       "bf16_speedup": round(cpu_bf16_matmul_speedup(), 2), "gpu": gpu})
