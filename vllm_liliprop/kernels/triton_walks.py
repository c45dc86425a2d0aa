"""Walks through a scored candidate lattice.

Lattice layout (as in vllm_liliprop/walks.py): start [B, K] scores anchor -> candidate j of
slot 0, pairs [B, S-1, K, K] scores candidate i of slot s -> candidate j of slot s+1.

greedy_walk: each slot takes the best successor of the previous pick. A step is one K-wide
  row gather and one reduction, so the walk is latency bound: a program handles ROWS requests
  side by side (a [ROWS, K] tile in one warp), which costs the same per step as one request.
viterbi_walk: the exact maximizer of start[j0] + sum_s pairs[s, j_s, j_{s+1}], computed the
  way the torch reference computes it: a backward pass builds best-to-go[s, j] (kept in
  registers, ROWS x S x K fp64), then a forward pass commits each slot to the lowest index
  that still attains the optimum. That is the lexicographically smallest maximizer; sums run
  in fp64 in the reference's operation order, so ties resolve identically (bit-exact paths).

Ties: lowest index. NaN: torch.argmax order (NaN above every number, lowest NaN first); in
Viterbi a NaN reachable downstream of a candidate makes its best-to-go NaN, as torch.amax does.
Scores of any float dtype are upcast in the kernel (fp32 for the greedy walk, which an exact
upcast cannot reorder; fp64 for Viterbi). Paths are int64 [B, S].
"""

import torch
import triton
import triton.language as tl

from vllm_liliprop.kernels.checks import check_dim, check_same_device, check_tensor
from vllm_liliprop.kernels.triton_keys import KEY_NONE, MAX, MIN, SUM, key_index, selection_key

# Viterbi keeps ROWS x S x K fp64 best-to-go values in registers.
MAX_VITERBI_TILE = 4096


@triton.jit
def _greedy_walk_kernel(
    start_ptr,
    start_stride_b,
    start_stride_k,
    pairs_ptr,
    pairs_stride_b,
    pairs_stride_s,
    pairs_stride_i,
    pairs_stride_j,
    path_ptr,  # [B, S] int64
    batch,
    num_slots,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ROWS: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    lane = tl.arange(0, BLOCK_K)[None, :]
    mask = (b < batch)[:, None] & (lane < K)
    scores = tl.load(start_ptr + b[:, None] * start_stride_b + lane * start_stride_k, mask=mask, other=0.0)
    keys = tl.where(mask, selection_key(scores.to(tl.float32), lane), KEY_NONE)
    pick = key_index(tl.reduce(keys, 1, MAX))
    tl.store(path_ptr + b * num_slots, pick, mask=b < batch)
    for s in range(1, num_slots):
        rows = pairs_ptr + b * pairs_stride_b + (s - 1) * pairs_stride_s + pick * pairs_stride_i
        scores = tl.load(rows[:, None] + lane * pairs_stride_j, mask=mask, other=0.0)
        keys = tl.where(mask, selection_key(scores.to(tl.float32), lane), KEY_NONE)
        pick = key_index(tl.reduce(keys, 1, MAX))
        tl.store(path_ptr + b * num_slots + s, pick, mask=b < batch)


@triton.jit
def _first_argmax(values, lane, mask):
    """[ROWS, BLOCK_K] fp64 -> [ROWS] int64: first maximum per row in torch.argmax order
    (NaN is the maximum), over the lanes where mask holds."""
    is_nan = (values != values) & mask
    values = tl.where(mask & (values == values), values, float("-inf"))
    best = tl.reduce(values, 1, MAX)
    any_nan = tl.reduce(is_nan.to(tl.int32), 1, MAX) > 0
    winner = tl.where(any_nan[:, None], is_nan, (values == best[:, None]) & mask)
    return tl.reduce(tl.where(winner, lane, 2**30), 1, MIN).to(tl.int64)


@triton.jit
def _viterbi_walk_kernel(
    start_ptr,
    start_stride_b,
    start_stride_k,
    pairs_ptr,
    pairs_stride_b,
    pairs_stride_s,
    pairs_stride_i,
    pairs_stride_j,
    path_ptr,  # [B, S] int64
    batch,
    num_slots,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_S: tl.constexpr,
    ROWS: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    in_batch = b < batch
    lane = tl.arange(0, BLOCK_K)[None, :]
    mask = in_batch[:, None] & (lane < K)
    b3 = b[:, None, None]
    i3 = tl.arange(0, BLOCK_K)[None, :, None]  # predecessor candidate
    j3 = tl.arange(0, BLOCK_K)[None, None, :]  # successor candidate
    mask3 = (b3 < batch) & (i3 < K) & (j3 < K)
    slot3 = tl.arange(0, BLOCK_S)[None, :, None]

    # Backward: to_go[b, s, j] = best score of slots s+1.. after candidate j at slot s.
    to_go = tl.zeros([ROWS, BLOCK_S, BLOCK_K], tl.float64)
    next_to_go = tl.zeros([ROWS, BLOCK_K], tl.float64)
    for r in range(1, num_slots):
        s = num_slots - 1 - r
        scores = tl.load(
            pairs_ptr + b3 * pairs_stride_b + s * pairs_stride_s + i3 * pairs_stride_i + j3 * pairs_stride_j,
            mask=mask3,
            other=0.0,
        ).to(tl.float64)
        total = tl.where(j3 < K, scores + next_to_go[:, None, :], float("-inf"))
        # torch.amax semantics: a NaN anywhere in the row makes the row's max NaN.
        is_nan = total != total
        row_max = tl.reduce(tl.where(is_nan, float("-inf"), total), 2, MAX)
        row_has_nan = tl.reduce(is_nan.to(tl.int32), 2, MAX) > 0
        next_to_go = tl.where(row_has_nan, float("nan"), row_max)
        to_go = tl.where(slot3 == s, next_to_go[:, None, :], to_go)

    # Forward: commit each slot to the lowest index attaining its best total.
    start = tl.load(start_ptr + b[:, None] * start_stride_b + lane * start_stride_k, mask=mask, other=0.0)
    pick = _first_argmax(start.to(tl.float64) + next_to_go, lane, mask)
    tl.store(path_ptr + b * num_slots, pick, mask=in_batch)
    for s in range(1, num_slots):
        rows = pairs_ptr + b * pairs_stride_b + (s - 1) * pairs_stride_s + pick * pairs_stride_i
        scores = tl.load(rows[:, None] + lane * pairs_stride_j, mask=mask, other=0.0).to(tl.float64)
        # Adding the zeros of the other slots leaves slot s's fp64 values exact.
        slot_to_go = tl.reduce(tl.where(slot3 == s, to_go, 0.0), 1, SUM)
        pick = _first_argmax(scores + slot_to_go, lane, mask)
        tl.store(path_ptr + b * num_slots + s, pick, mask=in_batch)


def _check_lattice(start: torch.Tensor, pairs: torch.Tensor) -> tuple[int, int, int]:
    check_tensor("start", start, 2)
    check_tensor("pairs", pairs, 4)
    check_same_device(start=start, pairs=pairs)
    batch, k = start.shape
    if k < 1:
        raise ValueError(f"start must be [B, K] with K >= 1, got shape {tuple(start.shape)}")
    check_dim("pairs", pairs, 0, batch, "start.shape[0] (B)")
    check_dim("pairs", pairs, 2, k, "start.shape[1] (K)")
    check_dim("pairs", pairs, 3, k, "start.shape[1] (K)")
    return batch, pairs.shape[1] + 1, k


def _rows_per_program(rows_per_program: int | None, batch: int, default: int) -> int:
    """Requests walked side by side in one program (a power of two), at most the batch."""
    if rows_per_program is None:
        rows_per_program = max(1, default)
    elif rows_per_program < 1 or rows_per_program & (rows_per_program - 1):
        raise ValueError(f"rows_per_program must be a power of two >= 1, got {rows_per_program}")
    return min(rows_per_program, triton.next_power_of_2(batch))


def greedy_walk(
    start: torch.Tensor, pairs: torch.Tensor, *, rows_per_program: int | None = None
) -> torch.Tensor:
    """start [B, K], pairs [B, S-1, K, K] (any float dtype, any strides) -> path [B, S] int64.

    rows_per_program (power of two) sets how many requests one program walks side by side;
    by default a [rows, K] tile of about 128 lanes, run by one warp.
    """
    batch, num_slots, k = _check_lattice(start, pairs)
    path = torch.empty(batch, num_slots, dtype=torch.int64, device=start.device)
    if batch == 0:
        return path
    block_k = triton.next_power_of_2(k)
    rows = _rows_per_program(rows_per_program, batch, default=128 // block_k)
    _greedy_walk_kernel[(triton.cdiv(batch, rows),)](
        start,
        *start.stride(),
        pairs,
        *pairs.stride(),
        path,
        batch,
        num_slots,
        K=k,
        BLOCK_K=block_k,
        ROWS=rows,
        num_warps=1,
    )
    return path


def viterbi_fits(num_slots: int, k: int) -> bool:
    """Whether an S-slot, K-candidate lattice fits viterbi_walk's register table."""
    return triton.next_power_of_2(num_slots) * triton.next_power_of_2(k) <= MAX_VITERBI_TILE


def viterbi_walk(
    start: torch.Tensor, pairs: torch.Tensor, *, rows_per_program: int | None = None
) -> torch.Tensor:
    """start [B, K], pairs [B, S-1, K, K] -> the lexicographically smallest maximizer of
    start[j0] + sum_s pairs[s, j_s, j_{s+1}] (fp64 sums), path [B, S] int64."""
    batch, num_slots, k = _check_lattice(start, pairs)
    block_k = triton.next_power_of_2(k)
    block_s = triton.next_power_of_2(num_slots)
    if not viterbi_fits(num_slots, k):
        raise ValueError(
            f"viterbi_walk keeps an S x K table in registers; S={num_slots}, K={k} exceeds "
            f"{MAX_VITERBI_TILE} padded entries. Use vllm_liliprop.walks.viterbi_walk for such "
            "lattices."
        )
    path = torch.empty(batch, num_slots, dtype=torch.int64, device=start.device)
    if batch == 0:
        return path
    # About 1024 fp64 per [rows, K, K] score tile and per [rows, S, K] best-to-go table.
    rows = _rows_per_program(rows_per_program, batch, default=1024 // (block_k * max(block_k, block_s)))
    _viterbi_walk_kernel[(triton.cdiv(batch, rows),)](
        start,
        *start.stride(),
        pairs,
        *pairs.stride(),
        path,
        batch,
        num_slots,
        K=k,
        BLOCK_K=block_k,
        BLOCK_S=block_s,
        ROWS=rows,
        num_warps=4,
    )
    return path
