"""Time the Triton kernels against torch eager and torch.compile of their references.

    python -m tools.kernels.bench            # CUDA: B in 1 8 32 64, S=15, K=8, V=151936
    python -m tools.kernels.bench --quick    # a small run (what the CPU test uses)

Every column of a row is measured in the same process on the same inputs, after warm-up, as
the median of per-call CUDA-event times (wall-clock on CPU). Ratios are reference time /
Triton time, so > 1 means the kernel is faster. The greedy walk is also timed against vLLM's
in-tree `_selector_walk_kernel` (DFlash2 / LiLiCorr candidate walk), copied out of vLLM's
source by kernels/upstream_walk.py (no vLLM import; `--upstream-walk DIR` where vLLM is absent).

Problem sizes follow one draft block: B requests, S = 15 drafted slots, K candidates; the
vocabulary-wide kernels see N = B * S rows of V logits.
Without a CUDA device the Triton columns cannot run; the torch columns are still timed on a
small problem so the harness itself is exercised.
"""

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from tools.kernels import upstream_walk
from tools.kernels.cases import kernel_cases
from vllm_liliprop.kernels import triton_available


def _time(fn: Callable, args: tuple, warmup: int, iters: int, cuda: bool) -> float:
    """Median milliseconds per call."""
    for _ in range(warmup):
        fn(*args)
    times = []
    if cuda:
        torch.cuda.synchronize()
        for _ in range(iters):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn(*args)
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end))
    else:
        for _ in range(iters):
            began = time.perf_counter()
            fn(*args)
            times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


def _vllm_selector_walk(source_dir: Path | None):
    """vLLM's greedy candidate walk as fn(start, pairs) -> path [B, S], or None (see
    kernels/upstream_walk.py). From `source_dir` if given, else copied out of the installed
    vLLM (never imported: the bench runs where there is no vLLM)."""
    try:
        if source_dir is None:
            source_dir = upstream_walk.export(Path(tempfile.mkdtemp(prefix="upstream_walk_")))
        return upstream_walk.greedy_walk_fn(upstream_walk.load_kernel(source_dir))
    except (OSError, ValueError) as error:
        print(f"  (vLLM selector walk unavailable: {error}; on a machine without vLLM pass "
              "--upstream-walk DIR from `python -m tools.kernels.upstream_walk export DIR`)")
        return None


def _format(ms: float | None) -> str:
    return "      -" if ms is None else f"{ms:7.3f}"


def _ratio(numerator: float | None, denominator: float | None) -> str:
    if numerator is None or denominator is None:
        return "     -"
    return f"{numerator / denominator:5.2f}x"


def run(args) -> None:
    cuda = torch.cuda.is_available()
    use_triton = cuda and triton_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = getattr(torch, args.dtype)
    if not use_triton:
        reason = "no CUDA device" if not cuda else "triton is not importable"
        print(f"NOTE: the Triton columns require a CUDA device with triton ({reason}); "
              f"timing only the torch paths on {device}.")
    compile_torch = not args.no_compile and (cuda or not args.quick)
    if not compile_torch:
        print("NOTE: torch.compile skipped (--no-compile, or --quick on CPU where inductor's C++ "
              "build takes about a minute per function).")
    print(f"device={device} dtype={args.dtype} S={args.slots} K={args.k} V={args.vocab} "
          f"warmup={args.warmup} iters={args.iters}; times in ms (median), ratios = reference / Triton")

    cases = kernel_cases(args.slots, args.k, args.vocab, device, dtype, dels_dtype=dtype)
    generator = torch.Generator().manual_seed(0)
    selector_walk = _vllm_selector_walk(args.upstream_walk) if use_triton else None
    for case in cases:
        print(f"\n{case.name}")
        header = "  batch  triton    eager  compiled  eager/triton  compiled/triton"
        with_vllm = case.name == "greedy_walk" and selector_walk is not None
        print(header + ("    vllm  vllm/triton" if with_vllm else ""))
        compiled = torch.compile(case.torch_fn, dynamic=False) if compile_torch else None
        for batch in args.batches:
            inputs = case.make_inputs(batch, generator)
            triton_ms = eager_ms = compiled_ms = vllm_ms = None
            if use_triton:
                triton_ms = _time(case.triton_fn(), inputs, args.warmup, args.iters, cuda)
            eager_ms = _time(case.torch_fn, inputs, args.warmup, args.iters, cuda)
            if compiled is not None:
                try:
                    compiled_ms = _time(compiled, inputs, args.warmup, args.iters, cuda)
                except Exception as error:  # report, keep the other columns
                    print(f"  torch.compile failed at batch {batch}: {type(error).__name__}: {error}")
                    compiled = None
            line = (f"  {batch:5d} {_format(triton_ms)}  {_format(eager_ms)}  {_format(compiled_ms)}"
                    f"        {_ratio(eager_ms, triton_ms)}           {_ratio(compiled_ms, triton_ms)}")
            if with_vllm:
                vllm_ms = _time(selector_walk, inputs, args.warmup, args.iters, cuda)
                agrees = torch.equal(selector_walk(*inputs), case.triton_fn()(*inputs))
                line += f" {_format(vllm_ms)}       {_ratio(vllm_ms, triton_ms)}"
                line += "" if agrees else "  (paths differ!)"
            print(line)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and few iterations")
    parser.add_argument("--batches", type=int, nargs="+", default=None)
    parser.add_argument("--slots", type=int, default=15, help="drafted slots S (block 16 -> 15)")
    parser.add_argument("--k", type=int, default=8, help="candidates K per slot")
    parser.add_argument("--vocab", type=int, default=None, help="vocabulary size V")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"],
                        help="dtype of logits and vectors (lattice scores are fp32)")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile column")
    parser.add_argument("--upstream-walk", type=Path, default=None,
                        help="folder from `python -m tools.kernels.upstream_walk export` "
                             "(default: copy it from the installed vLLM)")
    args = parser.parse_args(argv)
    quick = args.quick
    args.batches = args.batches or ([1, 8] if quick else [1, 8, 32, 64])
    args.vocab = args.vocab or (4096 if quick else 151_936)
    args.warmup = args.warmup if args.warmup is not None else (2 if quick else 10)
    args.iters = args.iters if args.iters is not None else (5 if quick else 50)
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
