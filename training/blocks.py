"""Random anchors and the draft blocks built around them.

An anchor is a position a whose token the target has just emitted; the block drafted from it
covers positions a+1 .. a+block_size-1 (the S = block_size - 1 drafted slots). Anchors are
drawn per example from a seed that depends only on the example (and epoch), not on which rank
or micro-batch it lands in: a data-parallel run and a resumed run see exactly the anchors of an
uninterrupted single-process run.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["eligible_anchors", "sample_anchors", "build_blocks", "block_windows", "example_seed"]


def example_seed(base_seed: int, epoch: int, example_index: int) -> int:
    """A 63-bit seed for one example in one epoch (splitmix64 of the three numbers)."""
    x = (base_seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + example_index) & (2**64 - 1)
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & (2**64 - 1)
    x ^= x >> 31
    return x & (2**63 - 1)


def eligible_anchors(loss_mask: torch.Tensor) -> torch.Tensor:
    """bool [B, T]: positions that may anchor a block.

    The anchor must be a supervised (assistant) token, as at serving time where the anchor is
    always a token the target generated, the first drafted slot must be supervised too, and
    there must be at least one context position before it.
    """
    eligible = torch.zeros_like(loss_mask, dtype=torch.bool)
    eligible[:, 1:-1] = loss_mask[:, 1:-1].bool() & loss_mask[:, 2:].bool()
    return eligible


def sample_anchors(
    loss_mask: torch.Tensor, num_anchors: int, seeds: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw up to `num_anchors` distinct anchors per example, without replacement.

    loss_mask [B, T] bool; seeds: one int per example. Returns anchors [B, N] int64 (sorted
    ascending within the valid ones) and valid [B, N] bool, N = min(num_anchors, the largest
    eligible count in the batch). Invalid entries hold anchor 1 and must be masked out.
    """
    if num_anchors < 1:
        raise ValueError(f"num_anchors must be >= 1, got {num_anchors}")
    batch, length = loss_mask.shape
    if len(seeds) != batch:
        raise ValueError(f"seeds has {len(seeds)} entries for a batch of {batch} examples")
    eligible = eligible_anchors(loss_mask).cpu()
    counts = eligible.sum(dim=1)
    n = max(1, min(num_anchors, int(counts.max())))
    anchors = torch.ones(batch, n, dtype=torch.int64)
    valid = torch.zeros(batch, n, dtype=torch.bool)
    for b in range(batch):
        generator = torch.Generator().manual_seed(int(seeds[b]))
        keys = torch.rand(length, generator=generator)
        keys[~eligible[b]] = 2.0
        take = min(n, int(counts[b]))
        chosen = keys.argsort()[:take].sort().values
        anchors[b, :take] = chosen
        valid[b, :take] = True
    return anchors.to(loss_mask.device), valid.to(loss_mask.device)


def build_blocks(
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    anchors: torch.Tensor,
    valid: torch.Tensor,
    block_size: int,
    mask_token_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query tokens and labels of every block.

    input_ids, loss_mask [B, T]; anchors, valid [B, N]. Returns
      block_ids [B, N, block_size]: [token at anchor, mask_token_id x (block_size - 1)],
      targets   [B, N, S] int64: the token at anchor + 1 + s, or -1 where unsupervised,
      slot_mask [B, N, S] bool: slot is in the sequence, loss-masked, and its block valid.
    """
    slots = block_size - 1
    block_ids = torch.full((*anchors.shape, block_size), mask_token_id, dtype=torch.int64, device=input_ids.device)
    block_ids[..., 0] = input_ids.gather(1, anchors)
    in_range = anchors.unsqueeze(-1) + 1 + torch.arange(slots, device=anchors.device) < input_ids.shape[1]
    supervised = block_windows(loss_mask.bool(), anchors, slots, offset=1)
    slot_mask = in_range & supervised & valid.unsqueeze(-1)
    tokens = block_windows(input_ids, anchors, slots, offset=1)
    targets = torch.where(slot_mask, tokens, torch.full_like(tokens, -1))
    return block_ids, targets, slot_mask


def block_windows(values: torch.Tensor, anchors: torch.Tensor, width: int, offset: int = 0) -> torch.Tensor:
    """values [B, T, ...] at positions anchor + offset + j, j < width -> [B, N, width, ...] for
    anchors [B, N]. A position past the end reads the last one (callers mask those slots)."""
    positions = anchors.unsqueeze(-1) + offset + torch.arange(width, device=anchors.device)
    positions = positions.clamp(max=values.shape[1] - 1)
    if values.dim() == 2:
        return values.gather(1, positions.flatten(1)).view_as(positions)
    rows = torch.arange(values.shape[0], device=anchors.device).view(-1, 1, 1)
    return values[rows, positions]
