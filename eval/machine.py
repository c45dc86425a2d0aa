"""The machine a measurement ran on, as a results column.

The same 2-core machine kind has run plain decoding of SmolLM2 at 18 and at 85 tokens/s on
different days: whether the host exposes AMX decides bf16 matmul speed (930 vs about 130
GFLOPS measured here), so every speed figure is only comparable within one kind of CPU. The
record names the CPU, the cores and the matrix instruction sets the kernels can use.
"""

from __future__ import annotations

import json
import os

import torch

from vllm_liliprop.host import cpu_model_and_flags

__all__ = ["machine_record"]

# The instruction sets that decide the CPU kernels' speed (oneDNN picks AMX > AVX512-BF16 > AVX2).
ISA_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2")


def machine_record(cpuinfo_path: str = "/proc/cpuinfo") -> str:
    """JSON: {"cpu", "cores" (usable by this process), "isa" (those of ISA_FLAGS present), "gpu"}."""
    model, flags = cpu_model_and_flags(cpuinfo_path)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 0
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    return json.dumps({"cpu": model, "cores": cores, "isa": [f for f in ISA_FLAGS if f in flags], "gpu": gpu})
