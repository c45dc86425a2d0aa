"""Torch references for the fused operations that have no single torch function elsewhere.

Each is the unfused composition the Triton kernel replaces; the kernels are tested against
these, and the dispatchers in vllm_liliprop.kernels run them on CPU tensors.
"""

import torch

from vllm_liliprop.heads.dels import dels_fuse
from vllm_liliprop.walks import greedy_walk


def greedy_walk_from_vectors(
    start: torch.Tensor, out_vec: torch.Tensor, in_vec: torch.Tensor, logit_scale
) -> torch.Tensor:
    """start [B, K], out_vec/in_vec [B, S, K, D], logit_scale float or 1-element tensor ->
    path [B, S] int64: greedy_walk over the materialized pairs
    pairs[b, s, i, j] = logit_scale * <out_vec[b, s, i], in_vec[b, s+1, j]> (fp32)."""
    if out_vec.dim() != 4 or out_vec.shape != in_vec.shape:
        raise ValueError(
            f"out_vec and in_vec must both be [B, S, K, D], got {tuple(out_vec.shape)} and "
            f"{tuple(in_vec.shape)}"
        )
    if isinstance(logit_scale, torch.Tensor):
        logit_scale = logit_scale.reshape(()).float()
    pairs = torch.matmul(out_vec[:, :-1].float(), in_vec[:, 1:].float().transpose(-1, -2))
    return greedy_walk(start, logit_scale * pairs)


def dels_argmax(long_logits, short_logits, log_prior, alpha, beta) -> torch.Tensor:
    """ids [...] int64: argmax over V of dels_fuse(long_logits, short_logits, log_prior, alpha, beta)."""
    return dels_fuse(long_logits, short_logits, log_prior, alpha, beta).argmax(dim=-1)

