"""Top-K candidate extraction for the lattice: the K most likely tokens of each draft slot."""

from __future__ import annotations

import torch


def topk_candidates(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-K tokens of each row and their full-vocabulary log-probabilities.

    Args:
        logits: [N, V] any float dtype.
        k: candidates per row, 1 <= k <= V.
    Returns:
        ids [N, K] int64 and log_probs [N, K] fp32, sorted by log-prob descending.
        log_probs = logit - logsumexp(logits) with the log-partition in fp32 (as upstream).

    Ties are deterministic: among equal logits the lowest token id ranks first, both when
    choosing which tied tokens enter the top K and when ordering them. torch.topk leaves that
    order unspecified, so the selection is done by value threshold instead: every token above
    the K-th largest value, then the lowest-id tokens equal to it until K are taken.
    Rows containing NaN give unspecified ids and NaN log-probs (no error).
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, V], got shape {tuple(logits.shape)}.")
    vocab = logits.shape[1]
    if not isinstance(k, int) or not 1 <= k <= vocab:
        raise ValueError(f"k = {k!r} must be an int in 1..V (V = {vocab}).")
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
