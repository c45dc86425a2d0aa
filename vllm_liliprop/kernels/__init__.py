"""Device dispatch for the draft-rule hot spots: Triton on CUDA tensors, torch elsewhere.

Every function here has the signature of its torch reference and returns the same dtypes and
shapes. CUDA tensors (with triton importable) run the Triton kernel; anything else runs the
torch reference, and that path never imports triton (the kernel modules are imported lazily,
inside the CUDA branch).

    topk_candidates(logits [N, V], k) -> ids [N, K] int64, log_probs [N, K] fp32
        reference: vllm_liliprop.heads.candidates.topk_candidates
    greedy_walk(start [B, K], pairs [B, S-1, K, K]) -> path [B, S] int64
        reference: vllm_liliprop.walks.greedy_walk
    viterbi_walk(start [B, K], pairs [B, S-1, K, K]) -> path [B, S] int64
        reference: vllm_liliprop.walks.viterbi_walk
    dels_argmax(long [N, V], short [N, V], log_prior [V], alpha, beta) -> ids [N] int64
        reference: vllm_liliprop.kernels.reference.dels_argmax

Shared numerical contract of the kernels (each module's docstring has the details):
  - accumulation in fp32 (Viterbi path sums in fp64, as its reference);
  - ties go to the lowest index (token id or candidate index);
  - NaN follows torch.argmax: it ranks above every number, lowest index first among NaNs, and
    poisons the sums it enters (a top-K row with a NaN has NaN log-probs). One known
    difference: dels_fuse log-softmaxes `short`, so its reference turns one NaN there into a
    NaN row (argmax 0), while dels_argmax picks that NaN's id; dels_fuse requires finite short;
  - no host synchronization: launch parameters depend only on shapes and the SM count, outputs
    are allocated on the device, nothing is read back, so calls are CUDA-graph capturable;
  - an empty batch returns empty outputs without launching a kernel.
Tools (in the checkout, not the wheel): `python -m tools.kernels.bench` (Triton vs torch eager vs torch.compile, and vLLM's
selector walk), `python -m tools.kernels.device_check` (GPU correctness, sync-free and
CUDA-graph capture checks), `python -m tools.kernels.cross_compile` (sm_90 build without
a GPU). Tests: tests/kernels (interpreted), run from tests/test_kernels_interpreted.py.
On a GPU machine without vLLM: `python -m tools.kernels.upstream_walk export DIR` here,
carry DIR there, and pass `--upstream-walk DIR` to the bench.

Layouts a kernel does not implement (dels_fuse's [.., S, V] per-slot schedules, broadcast short
logits, fp64 logits, Viterbi lattices too large for its register table) run the torch
reference on CUDA as well; that choice depends on shapes and dtypes only.
"""

import functools
import importlib.util

import torch

from vllm_liliprop import walks
from vllm_liliprop.heads.candidates import topk_candidates as torch_topk_candidates
from vllm_liliprop.kernels import reference

__all__ = [
    "dels_argmax",
    "greedy_walk",
    "topk_candidates",
    "triton_available",
    "viterbi_walk",
]


@functools.cache
def triton_available() -> bool:
    """Whether triton can be imported (checked without importing it)."""
    return importlib.util.find_spec("triton") is not None


def _use_triton(tensor) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.is_cuda and triton_available()


def topk_candidates(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    if _use_triton(logits):
        from vllm_liliprop.kernels import triton_topk

        return triton_topk.topk_candidates(logits, k)
    return torch_topk_candidates(logits, k)


def greedy_walk(start: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    if _use_triton(start):
        from vllm_liliprop.kernels import triton_walks

        return triton_walks.greedy_walk(start, pairs)
    return walks.greedy_walk(start, pairs)


def viterbi_walk(start: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    if _use_triton(start) and pairs.dim() == 4 and start.dim() == 2:
        from vllm_liliprop.kernels import triton_walks

        if triton_walks.viterbi_fits(num_slots=pairs.shape[1] + 1, k=start.shape[1]):
            return triton_walks.viterbi_walk(start, pairs)
    return walks.viterbi_walk(start, pairs)


def _dels_kernel_layout(long_logits, short_logits) -> bool:
    return (
        _use_triton(long_logits)
        and long_logits.dim() == 2
        and isinstance(short_logits, torch.Tensor)
        and short_logits.shape == long_logits.shape
        and long_logits.dtype != torch.float64
    )


def dels_argmax(long_logits, short_logits, log_prior, alpha, beta) -> torch.Tensor:
    if _dels_kernel_layout(long_logits, short_logits):
        from vllm_liliprop.kernels import triton_dels

        return triton_dels.dels_argmax(long_logits, short_logits, log_prior, alpha, beta)
    return reference.dels_argmax(long_logits, short_logits, log_prior, alpha, beta)

