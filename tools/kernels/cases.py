"""The kernels the bench and the device check run, each with its torch reference and the random
inputs of one draft block: B requests, S drafted slots, K candidates; the vocabulary-wide
kernels see N = B * S rows of V logits."""

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from vllm_liliprop import walks
from vllm_liliprop.heads.candidates import topk_candidates
from vllm_liliprop.kernels import reference


@dataclass(frozen=True)
class KernelCase:
    name: str  # the kernel function's name, in vllm_liliprop.kernels.<module>
    module: str
    make_inputs: Callable[[int, torch.Generator], tuple]  # (batch, generator) -> positional args
    torch_fn: Callable

    def triton_fn(self) -> Callable:
        # The kernel modules import triton: only a caller that runs the kernels imports them.
        return getattr(importlib.import_module(f"vllm_liliprop.kernels.{self.module}"), self.name)


def kernel_cases(num_slots: int, k: int, vocab_size: int, device: torch.device,
                 dtype: torch.dtype = torch.bfloat16, dels_dtype: torch.dtype = torch.float32
                 ) -> list[KernelCase]:
    """`dtype`: the logits of top-K; `dels_dtype`: the DeLS logits."""

    def randn(generator, *shape, dtype=torch.float32):
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

    def vocab_rows(batch, g):
        return randn(g, batch * num_slots, vocab_size, dtype=dtype), k

    def lattice(batch, g):
        return randn(g, batch, k), randn(g, batch, num_slots - 1, k, k)

    def dels(batch, g):
        rows = batch * num_slots
        log_prior = torch.log_softmax(randn(g, vocab_size), dim=0)
        alpha = torch.rand(rows, generator=g).to(device)
        return (randn(g, rows, vocab_size, dtype=dels_dtype), randn(g, rows, vocab_size, dtype=dels_dtype),
                log_prior, alpha, 0.3)

    return [
        KernelCase("topk_candidates", "triton_topk", vocab_rows, topk_candidates),
        KernelCase("greedy_walk", "triton_walks", lattice, walks.greedy_walk),
        KernelCase("viterbi_walk", "triton_walks", lattice, walks.viterbi_walk),
        KernelCase("dels_argmax", "triton_dels", dels, reference.dels_argmax),
    ]
