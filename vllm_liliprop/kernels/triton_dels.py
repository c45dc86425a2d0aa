"""DeLS-Spec fusion kernels: fused = long + alpha * log_softmax(short) - beta * log_prior.

The formula is vllm_liliprop.heads.dels.dels_fuse's, with [N, V] rows and alpha/beta given per
row (a number, a 0-dim tensor, or [N]).

dels_argmax: the fused argmax of each row, without the [N, V] fused tensor, in one read of long and short. log_softmax(short)
  differs from short by logsumexp(short), a constant of the row, so the argmax is taken over
  long + alpha * short - beta * log_prior and no V-wide normalizer is computed (the same
  shortcut rules/dels_draft.py takes). Same split-vocabulary layout as the top-K kernel: stage 1,
  grid (N, splits), keeps the best selection key of its slice; stage 2 reduces the splits.
  The ids equal dels_fuse(...).argmax(-1) except where two fused values are within rounding
  of each other (the two forms round differently).

Numerics: fp32 throughout (inputs of any float dtype are upcast in the kernel; fp64 inputs are
computed in fp32, unlike the reference, which keeps fp64). Ties go to the lowest token id.
NaN follows torch.argmax: a NaN fused value ranks above every number, lowest id first. The
reference turns a NaN in `short` into a NaN row (its log-softmax) whose argmax is id 0, while
dels_argmax picks the NaN's own id; short logits are required to be finite by dels_fuse.
"""

import torch
import triton
import triton.language as tl

from vllm_liliprop.kernels.checks import check_dim, check_same_device, check_tensor, row_coefficient
from vllm_liliprop.kernels.triton_keys import (
    KEY_NONE,
    MAX,
    key_index,
    selection_key,
)

DEFAULT_BLOCK_V = 4096


@triton.jit
def _dels_argmax_partial_kernel(
    long_ptr,
    long_row_stride,
    short_ptr,
    short_row_stride,
    prior_ptr,
    alpha,
    alpha_stride,
    beta,
    beta_stride,
    vocab_size,
    blocks_per_split,
    part_keys_ptr,  # [N, splits] int64
    BLOCK_V: tl.constexpr,
    ALPHA_IS_TENSOR: tl.constexpr,
    BETA_IS_TENSOR: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    a = alpha
    if ALPHA_IS_TENSOR:
        a = tl.load(alpha + row * alpha_stride).to(tl.float32)
    b = beta
    if BETA_IS_TENSOR:
        b = tl.load(beta + row * beta_stride).to(tl.float32)
    lane = tl.arange(0, BLOCK_V)
    best = tl.full([], KEY_NONE, tl.int64)
    first_col = split * blocks_per_split * BLOCK_V
    for block in range(blocks_per_split):
        cols = first_col + block * BLOCK_V + lane
        in_vocab = cols < vocab_size
        long = tl.load(long_ptr + row * long_row_stride + cols, mask=in_vocab, other=0.0).to(tl.float32)
        short = tl.load(short_ptr + row * short_row_stride + cols, mask=in_vocab, other=0.0).to(tl.float32)
        prior = tl.load(prior_ptr + cols, mask=in_vocab, other=0.0).to(tl.float32)
        fused = long + a * short - b * prior
        keys = tl.where(in_vocab, selection_key(fused, cols), KEY_NONE)
        best = tl.maximum(best, tl.reduce(keys, 0, MAX))
    tl.store(part_keys_ptr + row * tl.num_programs(1) + split, best)


@triton.jit
def _dels_argmax_merge_kernel(
    part_keys_ptr,
    ids_ptr,  # [N] int64
    num_splits,
    BLOCK_SPLITS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    split = tl.arange(0, BLOCK_SPLITS)
    keys = tl.load(part_keys_ptr + row * num_splits + split, mask=split < num_splits, other=KEY_NONE)
    tl.store(ids_ptr + row, key_index(tl.reduce(keys, 0, MAX)))


def _check_fusion_inputs(long_logits, short_logits, log_prior):
    check_tensor("long_logits", long_logits, 2)
    check_tensor("short_logits", short_logits, 2)
    check_tensor("log_prior", log_prior, 1)
    check_same_device(long_logits=long_logits, short_logits=short_logits, log_prior=log_prior)
    if short_logits.shape != long_logits.shape:
        raise ValueError(
            f"short_logits must have long_logits' shape {tuple(long_logits.shape)} (one short row "
            f"per long row), got {tuple(short_logits.shape)}"
        )
    check_dim("log_prior", log_prior, 0, long_logits.shape[1], "the vocabulary size V")
    return long_logits.shape


def _unit_stride_rows(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _split_vocabulary(num_rows, vocab_size, block_v, num_splits, device) -> tuple[int, int]:
    """-> (num_splits, blocks_per_split), about two programs per SM by default."""
    if block_v < 16 or block_v & (block_v - 1):
        raise ValueError(f"block_v must be a power of two >= 16, got {block_v}")
    num_blocks = triton.cdiv(vocab_size, block_v)
    if num_splits is None:
        sm_count = 1
        if device.type == "cuda":
            sm_count = torch.cuda.get_device_properties(device).multi_processor_count
        num_splits = triton.cdiv(2 * sm_count, num_rows)
    num_splits = max(1, min(num_splits, num_blocks))
    blocks_per_split = triton.cdiv(num_blocks, num_splits)
    return triton.cdiv(num_blocks, blocks_per_split), blocks_per_split


def dels_argmax(
    long_logits: torch.Tensor,
    short_logits: torch.Tensor,
    log_prior: torch.Tensor,
    alpha,
    beta,
    *,
    block_v: int = DEFAULT_BLOCK_V,
    num_splits: int | None = None,
) -> torch.Tensor:
    """argmax over V of long + alpha * log_softmax(short) - beta * log_prior.

    long_logits, short_logits [N, V] (any float dtype), log_prior [V], alpha/beta a number,
    a 0-dim tensor or [N]. Returns ids [N] int64 (lowest id on ties).
    """
    num_rows, vocab_size = _check_fusion_inputs(long_logits, short_logits, log_prior)
    device = long_logits.device
    alpha_arg, alpha_is_tensor, alpha_stride = row_coefficient("alpha", alpha, num_rows, device)
    beta_arg, beta_is_tensor, beta_stride = row_coefficient("beta", beta, num_rows, device)
    ids = torch.empty(num_rows, dtype=torch.int64, device=device)
    if num_rows == 0:
        return ids
    long_logits, short_logits = _unit_stride_rows(long_logits), _unit_stride_rows(short_logits)
    log_prior = _unit_stride_rows(log_prior)
    num_splits, blocks_per_split = _split_vocabulary(num_rows, vocab_size, block_v, num_splits, device)
    part_keys = torch.empty(num_rows, num_splits, dtype=torch.int64, device=device)
    _dels_argmax_partial_kernel[(num_rows, num_splits)](
        long_logits,
        long_logits.stride(0),
        short_logits,
        short_logits.stride(0),
        log_prior,
        alpha_arg,
        alpha_stride,
        beta_arg,
        beta_stride,
        vocab_size,
        blocks_per_split,
        part_keys,
        BLOCK_V=block_v,
        ALPHA_IS_TENSOR=alpha_is_tensor,
        BETA_IS_TENSOR=beta_is_tensor,
        num_warps=8 if block_v >= 2048 else 4,
    )
    _dels_argmax_merge_kernel[(num_rows,)](
        part_keys, ids, num_splits, BLOCK_SPLITS=triton.next_power_of_2(num_splits), num_warps=1
    )
    return ids

