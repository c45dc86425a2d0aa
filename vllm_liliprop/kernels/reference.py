"""Torch references for the fused operations that have no single torch function elsewhere.

Each is the unfused composition the Triton kernel replaces; the kernels are tested against
these, and the dispatchers in vllm_liliprop.kernels run them on CPU tensors.
"""

import torch

from vllm_liliprop.heads.dels import dels_fuse


def dels_argmax(long_logits, short_logits, log_prior, alpha, beta) -> torch.Tensor:
    """ids [...] int64: argmax over V of dels_fuse(long_logits, short_logits, log_prior, alpha, beta)."""
    return dels_fuse(long_logits, short_logits, log_prior, alpha, beta).argmax(dim=-1)

