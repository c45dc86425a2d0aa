"""Which rows of a draft batch a rule could not score: the one test every rule uses (plain torch);
and, at load time, the same test on the weights of the heads this package loads.

A row (one request's block) is faulty when any score it was drafted from holds NaN or +inf, or
when a score of what it drafted (its tokens, or its path through a lattice) is not finite. -inf
alone is no fault: a draft with a reduced vocabulary (upstream DFlash's `draft_vocab_size` with
a `d2t` map) gets -inf from vLLM's `compute_logits` at every target id outside it, so -inf
entries are normal; a row is unusable only if it drafted a token that scored -inf (every
choice was ruled out) or NaN.

Everything stays on the device: comparisons and reductions to a [B] bool, static shapes,
nothing read on the host, so a rule's draft step stays free of synchronizations
(tests/test_draft_step_sync_free.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import reduce

import torch


def _rows(scores: torch.Tensor) -> torch.Tensor:
    """[B, ...] -> [B, N] (a [B] tensor is one score per row)."""
    return scores.flatten(1) if scores.dim() > 1 else scores.unsqueeze(1)


def non_finite_rows(*scores: torch.Tensor,
                    chosen: torch.Tensor | Sequence[torch.Tensor] = ()) -> torch.Tensor:
    """[B] bool: rows with NaN or +inf anywhere in `scores`, or anything but a finite number in
    `chosen`.

    scores: tensors [B, ...] that the row's drafts were chosen from; [1, ...] for scores every
    row shares (a prior), broadcast against the others. chosen: tensors [B, ...] holding the
    score of each drafted token, or of the walked path.
    """
    chosen = (chosen,) if isinstance(chosen, torch.Tensor) else tuple(chosen)
    if not scores and not chosen:
        raise ValueError("non_finite_rows needs at least one scores or chosen tensor")
    # `x < inf` is False exactly for NaN and +inf: one comparison per element, -inf passes.
    flags = [~(_rows(s) < math.inf).all(-1) for s in scores]
    flags += [~torch.isfinite(_rows(c)).all(-1) for c in chosen]
    return reduce(torch.logical_or, flags)


def check_loaded_weights(tensors: dict[str, torch.Tensor], source: str, fix: str) -> None:
    """At load time, the weights of a head this package loads itself (a DeLS head and its prior,
    the LiLiCorr head): ValueError naming `source` and the tensor for a non-floating dtype, and
    `fix` too for any NaN/Inf value. Such a head would fault on every row at run time (the
    rows above), so it is refused before serving. The drafter's own weights are vLLM's to load:
    a NaN there is caught only at run time, by the rows' scores."""
    for name, tensor in tensors.items():
        if not tensor.is_floating_point():
            raise ValueError(f"{source}: {name!r} is {tensor.dtype}; weights must be floating "
                             "point (fp32, bf16 or fp16); re-export the head from its trained weights")
        if not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise ValueError(f"{source}: {name!r} holds {bad} NaN/Inf value(s); {fix}")
