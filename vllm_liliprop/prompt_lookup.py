"""Prompt lookup: a request's own earlier tokens as its draft, where they repeat (the hybrid rule).

vLLM's n-gram proposer drafts the tokens that followed an earlier occurrence of a request's
last n tokens, and nothing where there is none; a trained drafter drafts every step but is often
wrong where the text simply repeats (code, quoted context, a small model's loops). The hybrid
takes the lookup's continuation where one exists and the draft rule's block everywhere else,
in this package's proposer, so the drafter's pass (which keeps its context KV) runs every step.

Plain numpy and torch, no vLLM: the proposer hands over each request's tokens (prompt and
output, through the last verified token). Of the last `max_n` down to `min_n` tokens, the
longest suffix that occurred earlier is taken, at its most recent earlier occurrence (a loop's
latest period predicts its next one best). The continuation is copied forward LZ77-style, so a
repeat shorter than the block still fills it: position t copies from `start + t`, which may lie
in the continuation itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

__all__ = ["check_lookup_lengths", "lookup_continuation", "lookup_drafts"]


def check_lookup_lengths(value, where: str) -> tuple[int, int]:
    """(min_n, max_n) from a `[min_n, max_n]` option; ValueError naming `where` and the fix."""
    ok = (isinstance(value, (list, tuple)) and len(value) == 2
          and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
          and 1 <= value[0] <= value[1] <= 64)
    if not ok:
        raise ValueError(f"{where} = {value!r} must be [min_n, max_n], two integers with "
                         "1 <= min_n <= max_n <= 64 (the n-gram lengths looked up, e.g. [3, 5])")
    return int(value[0]), int(value[1])


def lookup_continuation(history: np.ndarray, min_n: int, max_n: int, k: int) -> np.ndarray | None:
    """The k tokens that would follow `history` [L] if it repeated its latest earlier occurrence
    of its longest matching suffix (max_n down to min_n tokens); None when no suffix recurs."""
    length = len(history)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        # Windows start at 0 .. L-1-n: each is followed by a token, and none is the suffix itself.
        windows = sliding_window_view(history[: length - 1], n)
        hits = np.flatnonzero((windows == history[length - n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            out = np.empty(k, dtype=np.int64)
            for t in range(k):
                source = start + t
                out[t] = history[source] if source < length else out[source - length]
            return out
    return None


def lookup_drafts(histories: Sequence[np.ndarray | None], min_n: int, max_n: int,
                  k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [B, k] int64, found [B] bool) for a batch; a None history (a request that drafts
    nothing this step, such as a prefill chunk) is not found."""
    ids = np.zeros((len(histories), k), dtype=np.int64)
    found = np.zeros(len(histories), dtype=bool)
    for row, history in enumerate(histories):
        if history is None:
            continue
        continuation = lookup_continuation(history, min_n, max_n, k)
        if continuation is not None:
            ids[row], found[row] = continuation, True
    return torch.from_numpy(ids), torch.from_numpy(found)
