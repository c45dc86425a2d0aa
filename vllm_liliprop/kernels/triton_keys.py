"""Selection keys, reductions and the split log-partition shared by the Triton kernels.

A selection key packs an fp32 score and a column index into one int64 so that a single
integer max picks the highest score and, among equal scores, the lowest index. The score
goes to the high 32 bits through an order-preserving float->int32 map; the low 32 bits hold
`2**31 - 1 - index`, so a smaller index makes a larger key. Because every key of a row is
distinct, "remove the winner" is an exact `keys == best` test, which is what lets the top-K
kernel extract winners one by one without sorting.

NaN ranks above every number, +inf included, and NaNs tie with each other (so the lowest-index
NaN wins), which is torch.argmax's order. -0.0 is read as +0.0, so keys tie exactly when the
floats compare equal.

Reductions are written `tl.reduce(x, 0, MAX)` with Triton's own combine functions instead of
`tl.max(x)`. On the GPU both lower to the same reduction; under TRITON_INTERPRET=1, tl.max is
a device-function call that re-patches triton.language (milliseconds per call), while
tl.reduce with these combine functions runs as one numpy call. It keeps the interpreted test
suite fast.
"""

import triton
import triton.language as tl
import triton.language.standard as _standard

# Below every real key (the key of (-inf, index) is about -9.19e18, this is -9.22e18).
KEY_NONE: tl.constexpr = tl.constexpr(-(2**63))
# Above every real key; parks padding lanes where a running minimum never picks them.
KEY_MAX: tl.constexpr = tl.constexpr(2**63 - 1)


@triton.jit
def _maximum(a, b):
    return tl.maximum(a, b)


@triton.jit
def _minimum(a, b):
    return tl.minimum(a, b)


@triton.jit
def _add(a, b):
    return a + b


# Triton's combine functions when present (the interpreter fast-paths them by identity);
# equivalent local ones otherwise, which are just as fast on the GPU.
MAX = getattr(_standard, "_elementwise_max", _maximum)
MIN = getattr(_standard, "_elementwise_min", _minimum)
SUM = getattr(_standard, "_sum_combine", _add)


@triton.jit
def selection_key(score, index):
    """fp32 score, int index (< 2**31) -> int64 key; larger key = better (score, -index)."""
    score = tl.where(score == 0.0, 0.0, score)
    bits = score.to(tl.int32, bitcast=True)
    ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    # Every NaN (either sign, any payload) becomes the largest int32, above +inf's 0x7F800000.
    ordered = tl.where(score != score, 0x7FFFFFFF, ordered)
    return (ordered.to(tl.int64) << 32) + (2147483647 - index.to(tl.int64))


@triton.jit
def key_score(key):
    """Inverse of `selection_key` for the score: int64 key -> fp32 score (bit exact, NaN
    comes back as a NaN)."""
    ordered = (key >> 32).to(tl.int32)
    bits = tl.where(ordered < 0, ordered ^ 0x7FFFFFFF, ordered)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def key_index(key):
    """Inverse of `selection_key` for the index: int64 key -> int64 index."""
    low = key - ((key >> 32) << 32)
    return 2147483647 - low


@triton.jit
def online_logsumexp(run_max, run_sumexp, x):
    """Fold block x (fp32) into a running (max, sum of exp(x - max)) -> the updated pair.

    An infinite max shifts by 0, so exp() gives 0 (all -inf so far) or inf (a +inf logit)
    instead of the NaN of inf - inf; NaN entries still poison the sum, as in torch.
    """
    new_max = tl.maximum(run_max, tl.reduce(x, 0, MAX))
    shift = tl.where(tl.abs(new_max) == float("inf"), 0.0, new_max)
    new_sumexp = run_sumexp * tl.exp(run_max - shift) + tl.reduce(tl.exp(x - shift), 0, SUM)
    return new_max, new_sumexp


@triton.jit
def merged_log_partition(part_max_ptr, part_sumexp_ptr, row, num_splits, BLOCK_SPLITS: tl.constexpr):
    """logsumexp of a row from its per-split (max, sum-exp) partials, [N, splits] fp32 each."""
    split = tl.arange(0, BLOCK_SPLITS)
    has_split = split < num_splits
    part_max = tl.load(part_max_ptr + row * num_splits + split, mask=has_split, other=float("-inf"))
    part_sumexp = tl.load(part_sumexp_ptr + row * num_splits + split, mask=has_split, other=0.0)
    row_max = tl.reduce(part_max, 0, MAX)
    shift = tl.where(tl.abs(row_max) == float("inf"), 0.0, row_max)
    return row_max + tl.log(tl.reduce(part_sumexp * tl.exp(part_max - shift), 0, SUM))
