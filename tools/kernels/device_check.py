"""One-shot correctness check of the Triton kernels on a real device.

    python -m tools.kernels.device_check            # CUDA: serving shapes + CUDA graphs
    TRITON_INTERPRET=1 python -m tools.kernels.device_check --quick   # CPU, interpreted

For each kernel and batch it compares the Triton result with the torch reference run on the
same device and inputs (ids/paths exactly, scores to 2e-5). On CUDA it also
  - runs every Triton call under torch.cuda.set_sync_debug_mode("error"), so a hidden
    host synchronization raises, and
  - captures every call in a CUDA graph, replays it on fresh inputs copied into the captured
    buffers, and checks the replayed outputs against the reference.
Exit status 0 only if every check passed. The interpreted tests cover ties, NaN and the edge
cases; this script is the part that needs the GPU.
"""

import argparse
import sys
from collections.abc import Callable

import torch

from tools.kernels.cases import kernel_cases


def _as_tuple(output) -> tuple:
    return output if isinstance(output, tuple) else (output,)


def _compare(got, expected) -> str | None:
    """None if equal (integers exactly, floats to 2e-5), else a description."""
    for index, (a, b) in enumerate(zip(_as_tuple(got), _as_tuple(expected))):
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"output {index}: {a.dtype}{tuple(a.shape)} vs reference {b.dtype}{tuple(b.shape)}"
        if a.is_floating_point():
            if not torch.allclose(a.float(), b.float(), rtol=0, atol=2e-5, equal_nan=True):
                return f"output {index}: max abs diff {(a.float() - b.float()).abs().max().item():.3g}"
        elif not torch.equal(a, b):
            mismatched = (a != b).reshape(a.shape[0], -1).any(dim=1).sum().item()
            return f"output {index}: {mismatched} of {a.shape[0]} rows differ"
    return None


def _graph_replay(fn: Callable, args: tuple, fresh_args: tuple):
    """Capture fn(*args) in a CUDA graph, copy fresh_args into the captured tensors, replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(*args)  # warm-up on a side stream compiles the kernels outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = fn(*args)
    for captured, fresh in zip(args, fresh_args):
        if isinstance(captured, torch.Tensor):
            captured.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    return output


def run(args) -> bool:
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    failures = 0
    for case in kernel_cases(args.slots, args.k, args.vocab, device):
        name, make_inputs, triton_fn, torch_fn = case.name, case.make_inputs, case.triton_fn(), case.torch_fn
        for batch in args.batches:
            generator = torch.Generator().manual_seed(batch)
            inputs = make_inputs(batch, generator)
            expected = torch_fn(*inputs)
            if cuda:
                torch.cuda.set_sync_debug_mode("error")
            try:
                got = triton_fn(*inputs)
                problem = _compare(got, expected)
            except Exception as error:  # a sync under debug mode, a launch failure
                problem = f"{type(error).__name__}: {error}"
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode("default")
            if problem is None and cuda:
                fresh = make_inputs(batch, generator)
                try:
                    problem = _compare(_graph_replay(triton_fn, inputs, fresh), torch_fn(*fresh))
                    problem = problem and f"CUDA graph replay: {problem}"
                except Exception as error:
                    problem = f"CUDA graph capture: {type(error).__name__}: {error}"
            failures += problem is not None
            print(f"{'FAIL' if problem else 'ok  '} {name:26s} batch {batch:3d}  {problem or ''}", flush=True)
    print(f"{failures} failures" if failures else "all checks passed")
    return failures == 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes (what the CPU test runs)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    args.batches = [1, 3] if args.quick else [1, 8, 32, 64]
    args.slots, args.k = 15, 8
    args.vocab = 1000 if args.quick else 151_936
    return 0 if run(args) else 1


if __name__ == "__main__":
    sys.exit(main())
