"""Compile every Triton kernel of this package to a CUDA binary without a GPU.

    python -m tools.kernels.cross_compile [--arch 90 80]

Triton ships ptxas, so the whole pipeline (Triton IR -> LLVM -> PTX -> cubin) runs on a CPU
machine. This catches what the interpreter cannot: constructs that lower differently (or not at
all) on the real backend, layout conversions, register/shared-memory limits. It does not run
anything; numerical agreement is what the interpreted tests check.

Each spec below names one launch configuration the wrappers use. Pointer arguments and float
scalars are listed; every other runtime argument is an int32 size or stride.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile as triton_compile

from vllm_liliprop.kernels import triton_dels, triton_topk, triton_walks

_WALK_POINTERS = {"start_ptr": "*fp32", "pairs_ptr": "*fp32", "path_ptr": "*i64"}
_TOPK_PARTS = {"part_max_ptr": "*fp32", "part_sumexp_ptr": "*fp32", "part_keys_ptr": "*i64"}

# (kernel, types of its pointer and float arguments, constexpr values, num_warps)
KERNEL_SPECS = [
    (triton_topk._topk_partial_kernel, {"logits_ptr": "*bf16", **_TOPK_PARTS},
     {"K": 16, "BLOCK_K": 16, "BLOCK_V": 4096}, 8),
    (triton_topk._topk_partial_kernel, {"logits_ptr": "*fp32", **_TOPK_PARTS},
     {"K": 1, "BLOCK_K": 1, "BLOCK_V": 4096}, 8),
    (triton_topk._topk_merge_kernel, {**_TOPK_PARTS, "ids_ptr": "*i64", "log_probs_ptr": "*fp32"},
     {"K": 16, "BLOCK_K": 16, "BLOCK_SPLITS": 64, "BLOCK_KEYS": 1024}, 4),
    (triton_walks._greedy_walk_kernel, _WALK_POINTERS, {"K": 16, "BLOCK_K": 16, "ROWS": 8}, 1),
    (triton_walks._greedy_walk_kernel, _WALK_POINTERS, {"K": 1, "BLOCK_K": 1, "ROWS": 128}, 1),
    (triton_walks._viterbi_walk_kernel, _WALK_POINTERS, {"K": 16, "BLOCK_K": 16, "BLOCK_S": 16, "ROWS": 4}, 4),
    (triton_walks._viterbi_walk_kernel, _WALK_POINTERS, {"K": 1, "BLOCK_K": 1, "BLOCK_S": 1, "ROWS": 1}, 4),
    (triton_dels._dels_argmax_partial_kernel,
     {"long_ptr": "*bf16", "short_ptr": "*bf16", "prior_ptr": "*fp32", "alpha": "*fp32", "beta": "fp32",
      "part_keys_ptr": "*i64"},
     {"BLOCK_V": 4096, "ALPHA_IS_TENSOR": True, "BETA_IS_TENSOR": False}, 8),
    (triton_dels._dels_argmax_merge_kernel, {"part_keys_ptr": "*i64", "ids_ptr": "*i64"},
     {"BLOCK_SPLITS": 256}, 1),
]


def _signature(kernel, typed: dict, constexprs: dict) -> dict:
    signature = {}
    for param in kernel.params:
        name = param.name
        if param.is_constexpr:
            signature[name] = "constexpr"
        elif name in typed:
            signature[name] = typed[name]
        elif name.endswith("_ptr"):
            raise ValueError(f"{kernel.__name__}: pointer {name} has no type in its spec")
        else:
            signature[name] = "i32"
    missing = [p.name for p in kernel.params if p.is_constexpr and p.name not in constexprs]
    if missing:
        raise ValueError(f"{kernel.__name__}: constexprs {missing} have no value in its spec")
    return signature


def _resource_usage(cubin: bytes) -> str:
    """Registers / stack (spills) / shared memory of a cubin, read with Triton's cuobjdump."""
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(cuobjdump):
        return "resource usage unavailable (no cuobjdump)"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        dump = subprocess.run([cuobjdump, "--dump-resource-usage", file.name], capture_output=True, text=True)
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", dump.stdout)
    return "registers {} stack {} shared {}".format(*found.groups()) if found else "resource usage unreadable"


def compile_all(arch: int) -> list[tuple[str, float, str]]:
    """Compile every spec for sm_<arch>; returns (kernel name, seconds, resource usage) per spec."""
    target = GPUTarget("cuda", arch, 32)
    results = []
    for kernel, typed, constexprs, num_warps in KERNEL_SPECS:
        source = ASTSource(fn=kernel, signature=_signature(kernel, typed, constexprs), constexprs=constexprs)
        began = time.perf_counter()
        compiled = triton_compile(source, target=target, options={"num_warps": num_warps})
        results.append((kernel.__name__, time.perf_counter() - began, _resource_usage(compiled.asm["cubin"])))
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, nargs="+", default=[90], help="SM versions, e.g. 90 80")
    args = parser.parse_args(argv)
    for arch in args.arch:
        for name, seconds, usage in compile_all(arch):
            print(f"sm_{arch}  {name:34s} {seconds:6.2f} s  {usage}")
    print(f"compiled {len(KERNEL_SPECS)} kernel specs for {', '.join(f'sm_{a}' for a in args.arch)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
