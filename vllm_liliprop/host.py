"""What the CPU this process runs on can do, read from /proc/cpuinfo.

Whether a host exposes AMX decides how fast bf16 runs on it: measured on the 2-core machines
this project runs on, bf16 matmul at about 930 GFLOPS with AMX and 132 without (fp32: 162), so
bf16 autocast pays on one kind of host and costs on the other.
"""

from __future__ import annotations

import functools
import platform

__all__ = ["cpu_model_and_flags", "cpu_has_amx"]


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


@functools.cache  # the trainer asks on every step; the CPU does not change under a process
def cpu_has_amx(path: str = "/proc/cpuinfo") -> bool:
    return "amx_bf16" in cpu_model_and_flags(path)[1]
