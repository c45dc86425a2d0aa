"""Top-K candidate extraction for the lattice: the K most likely tokens of each draft slot."""

from __future__ import annotations

import torch


def _check(logits: torch.Tensor, k: int) -> None:
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, V], got shape {tuple(logits.shape)}.")
    vocab = logits.shape[1]
    if not isinstance(k, int) or not 1 <= k <= vocab:
        raise ValueError(f"k = {k!r} must be an int in 1..V (V = {vocab}).")


def topk_candidates(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-K tokens of each row and their full-vocabulary log-probabilities.

    Args:
        logits: [N, V] any float dtype.
        k: candidates per row, 1 <= k <= V.
    Returns:
        ids [N, K] int64 and log_probs [N, K] fp32, sorted by log-prob descending.
        log_probs = logit - logsumexp(logits) with the log-partition in fp32 (as upstream).

    Ties are deterministic: among equal logits the lowest token id ranks first, both when
    choosing which tied tokens enter the top K and when ordering them. Rows containing NaN give
    unspecified ids and NaN log-probs (no error).

    On CPU tensors this takes `topk_candidates_fast` (two passes over the vocabulary instead of
    about ten); elsewhere `topk_candidates_reference`, which never reads a value on the host.
    Both return exactly the same tensors (tests/test_lattice_fast.py).
    """
    _check(logits, k)
    if logits.device.type == "cpu":
        return topk_candidates_fast(logits, k)
    return topk_candidates_reference(logits, k)


def topk_candidates_reference(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`topk_candidates` by value threshold, with static shapes and no host reads.

    torch.topk leaves the order of ties unspecified, so the selection is done by value
    threshold instead: every token above the K-th largest value, then the lowest-id tokens
    equal to it until K are taken.
    """
    _check(logits, k)
    vocab = logits.shape[1]
    logits = logits.float()
    log_partition = torch.logsumexp(logits, dim=-1, keepdim=True)

    # The multiset of the K largest values is unique even when their positions are not.
    kth = torch.topk(logits, k, dim=-1).values[:, -1:]
    above = logits > kth
    at_kth = logits == kth
    room = k - above.sum(dim=-1, keepdim=True)
    chosen = above | (at_kth & (at_kth.cumsum(dim=-1) <= room))

    # Exactly K chosen per row (for NaN-free rows); pull their ids out in ascending order by
    # ranking the integer key V - id, which is 0 for tokens not chosen.
    token_id = torch.arange(vocab, device=logits.device)
    key = torch.where(chosen, vocab - token_id, 0)
    ids = torch.topk(key, k, dim=-1).indices
    # A stable descending sort keeps ascending id order among equal values.
    values, order = torch.sort(logits.gather(-1, ids), dim=-1, descending=True, stable=True)
    ids = ids.gather(-1, order)
    return ids.to(torch.int64), values - log_partition


def topk_candidates_fast(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`topk_candidates` from one torch.topk of 2K entries; reads the host (meant for CPU).

    Both functions return the first K tokens of the order (value descending, id ascending).
    torch.topk(2K) returns the 2K largest values; when the 2K-th is strictly below the K-th,
    every token whose value is >= the K-th is among the 2K returned, so ordering those 2K by
    (value descending, id ascending) -- a sort by id, then a stable sort by value -- gives the
    same first K. When a row breaks that (a tie group reaching past rank 2K, NaN, a row of
    -inf), the whole batch is computed by `topk_candidates_reference` instead.
    """
    _check(logits, k)
    vocab = logits.shape[1]
    wide = min(2 * k, vocab)
    if wide == k or logits.shape[0] == 0:
        return topk_candidates_reference(logits, k)
    logits = logits.float()
    log_partition = torch.logsumexp(logits, dim=-1, keepdim=True)
    top_values, top_ids = torch.topk(logits, wide, dim=-1)
    # NaN anywhere in a row makes its logsumexp NaN; topk ranks NaN first, checked as well.
    resolved = (
        (top_values[:, -1] < top_values[:, k - 1])
        & (top_values[:, 0] == top_values[:, 0])
        & (log_partition[:, 0] == log_partition[:, 0])
    )
    if not bool(resolved.all()):
        return topk_candidates_reference(logits, k)
    ids = top_ids.sort(dim=-1).values
    values, order = torch.sort(logits.gather(-1, ids), dim=-1, descending=True, stable=True)
    ids, values = ids.gather(-1, order[:, :k]), values[:, :k]
    return ids, values - log_partition
