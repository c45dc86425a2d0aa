"""Fused full-vocabulary log-softmax + top-K per row, in one read of the logits.

Design (split-vocabulary, single pass over the data):
  stage 1, grid (N, splits): each program walks its slice of the vocabulary in BLOCK_V
    chunks, keeping an online max / sum-exp (rescaled when the max grows) and a running
    top-K of selection keys (see triton_keys.py). A chunk whose best key does not beat the
    running K-th key costs one reduction; otherwise winners are moved in one at a time
    (at most K per chunk), each replacing the running minimum.
  stage 2, grid (N,): merges the splits' (max, sum-exp) into log Z and extracts the K best of
    the splits*K keys in order, writing ids and `logit - log Z`.
Splitting the vocabulary keeps every SM busy at batch 1, where one program per row would
leave the GPU idle. The split count depends only on shapes and the SM count, so the launch
is static and CUDA-graph capturable; nothing reads device values on the host.

Numerics: fp32 accumulation whatever the input dtype; log_probs = logit - log Z exactly as
the torch reference defines them. Candidates are ranked by their fp32 logit, ties to the lowest
token id; this is the log-prob order except where two distinct logits round to the same
log-prob. Non-finite logits follow torch: NaN ranks above every number (lowest id first among
NaNs) and makes the whole row's log-probs NaN; a row of -inf only gives log-probs NaN
(-inf - -inf) and ids 0..K-1; a +inf logit gives log Z = +inf, so its own log-prob is NaN and
every finite one -inf.
"""

import torch
import triton
import triton.language as tl

from vllm_liliprop.kernels.checks import check_k, check_tensor
from vllm_liliprop.kernels.triton_keys import (
    KEY_MAX,
    KEY_NONE,
    MAX,
    MIN,
    key_index,
    key_score,
    merged_log_partition,
    online_logsumexp,
    selection_key,
)

DEFAULT_BLOCK_V = 4096
MAX_MERGED_KEYS = 1024


@triton.jit
def _topk_partial_kernel(
    logits_ptr,
    logits_row_stride,
    vocab_size,
    blocks_per_split,
    part_max_ptr,  # [N, splits] fp32
    part_sumexp_ptr,  # [N, splits] fp32
    part_keys_ptr,  # [N, splits, K] int64
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    num_splits = tl.num_programs(1)
    slot = tl.arange(0, BLOCK_K)
    lane = tl.arange(0, BLOCK_V)
    row_ptr = logits_ptr + row.to(tl.int64) * logits_row_stride

    # Distinct placeholders so `running == worst` always names exactly one slot.
    running = tl.where(slot < K, KEY_NONE + 1 + slot.to(tl.int64), KEY_MAX)
    worst = tl.reduce(running, 0, MIN)
    run_max = tl.full([], float("-inf"), tl.float32)
    run_sumexp = tl.zeros([], tl.float32)

    first_col = split * blocks_per_split * BLOCK_V
    for block in range(blocks_per_split):
        cols = first_col + block * BLOCK_V + lane
        in_vocab = cols < vocab_size
        x = tl.load(row_ptr + cols, mask=in_vocab, other=float("-inf")).to(tl.float32)

        run_max, run_sumexp = online_logsumexp(run_max, run_sumexp, x)

        keys = tl.where(in_vocab, selection_key(x, cols), KEY_NONE)
        best = tl.reduce(keys, 0, MAX)
        while best > worst:
            running = tl.where(running == worst, best, running)
            keys = tl.where(keys == best, KEY_NONE, keys)
            worst = tl.reduce(running, 0, MIN)
            best = tl.reduce(keys, 0, MAX)

    part = row * num_splits + split
    tl.store(part_max_ptr + part, run_max)
    tl.store(part_sumexp_ptr + part, run_sumexp)
    tl.store(part_keys_ptr + part.to(tl.int64) * K + slot, running, mask=slot < K)


@triton.jit
def _topk_merge_kernel(
    part_max_ptr,
    part_sumexp_ptr,
    part_keys_ptr,
    ids_ptr,  # [N, K] int64
    log_probs_ptr,  # [N, K] fp32
    num_splits,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_SPLITS: tl.constexpr,
    BLOCK_KEYS: tl.constexpr,
):
    row = tl.program_id(0)
    log_norm = merged_log_partition(part_max_ptr, part_sumexp_ptr, row, num_splits, BLOCK_SPLITS)

    key_offs = tl.arange(0, BLOCK_KEYS)
    keys = tl.load(
        part_keys_ptr + row.to(tl.int64) * num_splits * K + key_offs,
        mask=key_offs < num_splits * K,
        other=KEY_NONE,
    )
    rank = tl.arange(0, BLOCK_K)
    top = tl.full([BLOCK_K], KEY_NONE, tl.int64)
    for r in tl.static_range(K):
        best = tl.reduce(keys, 0, MAX)
        keys = tl.where(keys == best, KEY_NONE, keys)
        top = tl.where(rank == r, best, top)
    log_probs = key_score(top) - log_norm
    out = row.to(tl.int64) * K + rank
    tl.store(ids_ptr + out, key_index(top), mask=rank < K)
    tl.store(log_probs_ptr + out, log_probs, mask=rank < K)


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def topk_candidates(
    logits: torch.Tensor, k: int, *, block_v: int = DEFAULT_BLOCK_V, num_splits: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-K of log_softmax(logits) per row.

    logits: [N, V] fp32/bf16/fp16, last dim contiguous. k: 1 <= k <= V.
    Returns ids [N, k] int64 and log_probs [N, k] fp32, best first, ties to the lowest id.
    block_v (power of two) and num_splits tune the launch; by default the vocabulary is split
    so that about two programs run per SM.
    """
    check_tensor("logits", logits, 2)
    num_rows, vocab_size = logits.shape
    check_k(k, vocab_size)
    if block_v < 16 or block_v & (block_v - 1):
        raise ValueError(f"block_v must be a power of two >= 16, got {block_v}")
    ids = torch.empty(num_rows, k, dtype=torch.int64, device=logits.device)
    log_probs = torch.empty(num_rows, k, dtype=torch.float32, device=logits.device)
    if num_rows == 0:
        return ids, log_probs
    if logits.stride(1) != 1:
        logits = logits.contiguous()

    num_blocks = triton.cdiv(vocab_size, block_v)
    if num_splits is None:
        num_splits = triton.cdiv(2 * _sm_count(logits.device), num_rows)
    # The merge holds splits * K keys in registers; more than MAX_MERGED_KEYS would spill.
    num_splits = max(1, min(num_splits, num_blocks, MAX_MERGED_KEYS // k))
    blocks_per_split = triton.cdiv(num_blocks, num_splits)
    num_splits = triton.cdiv(num_blocks, blocks_per_split)

    part_max = torch.empty(num_rows, num_splits, dtype=torch.float32, device=logits.device)
    part_sumexp = torch.empty_like(part_max)
    part_keys = torch.empty(num_rows, num_splits, k, dtype=torch.int64, device=logits.device)
    _topk_partial_kernel[(num_rows, num_splits)](
        logits,
        logits.stride(0),
        vocab_size,
        blocks_per_split,
        part_max,
        part_sumexp,
        part_keys,
        K=k,
        BLOCK_K=triton.next_power_of_2(k),
        BLOCK_V=block_v,
        num_warps=8 if block_v >= 2048 else 4,
    )
    _topk_merge_kernel[(num_rows,)](
        part_max,
        part_sumexp,
        part_keys,
        ids,
        log_probs,
        num_splits,
        K=k,
        BLOCK_K=triton.next_power_of_2(k),
        BLOCK_SPLITS=triton.next_power_of_2(num_splits),
        BLOCK_KEYS=triton.next_power_of_2(num_splits * k),
        num_warps=4,
    )
    return ids, log_probs
