"""Walks through a scored candidate lattice: pick one candidate per slot.

A lattice of B requests, S slots and K candidates per slot is given by
    start [B, K]:          score of anchor -> candidate j of slot 0,
    pairs [B, S-1, K, K]:  pairs[b, s, i, j] scores candidate i of slot s -> candidate j of s+1.
A path idx [B, S] (int64, values in 0..K-1) scores
    g = start[idx_0] + sum_s pairs[s, idx_s, idx_{s+1}]                  (LiLiCorr Eq. 12)

Walks:
    greedy_walk   commit each slot to the best successor of the previous pick (Eq. 8).
    viterbi_walk  the exact maximizer of g (Appendix E), by dynamic programming.
    sampled_walk  draw each slot from softmax(conditional scores / T), and return the
                  distributions drawn from (what the rejection sampler needs).

Tie rule everywhere: the lowest index wins (torch.argmax returns the first maximum). For
viterbi_walk this extends to whole paths: among all maximizers of g it returns the
lexicographically smallest index sequence, which prefers higher-ranked candidates early.

Non-finite scores never raise. NaN ranks above every number (torch.argmax semantics), so a
NaN entry is picked by the greedy rules; sampled steps whose softmax is not finite fall back to
that greedy pick with a one-hot distribution. Callers that must reject such lattices check the
scores themselves (`vllm_liliprop.faults.non_finite_rows`, as the lattice rules do).

Pure torch and batched over B; the loop over slots is sequential by nature.
"""

from __future__ import annotations

import torch

# Temperatures below this are greedy: vLLM's sampler threshold, shared by every sampled rule.
GREEDY_TEMPERATURE = 1e-5


def _num_slots(start: torch.Tensor, pairs: torch.Tensor) -> int:
    if start.dim() != 2 or start.shape[1] < 1:
        raise ValueError(f"start must be [B, K] with K >= 1, got shape {tuple(start.shape)}.")
    bsz, k = start.shape
    if pairs.dim() != 4 or pairs.shape[0] != bsz or pairs.shape[2:] != (k, k):
        raise ValueError(
            f"pairs must be [B, S-1, K, K] = [{bsz}, S-1, {k}, {k}] to match start, "
            f"got shape {tuple(pairs.shape)}."
        )
    return pairs.shape[1] + 1


def _successor_scores(pairs: torch.Tensor, slot: int, prev: torch.Tensor) -> torch.Tensor:
    """pairs[b, slot, prev[b], :] -> [B, K]: scores of every successor of each request's pick."""
    rows = torch.arange(pairs.shape[0], device=pairs.device)
    return pairs[rows, slot, prev]


def greedy_walk(start: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """Left-to-right argmax walk (Eq. 8). Returns idx [B, S] int64; ties to the lowest index."""
    num_slots = _num_slots(start, pairs)
    idx = torch.empty(start.shape[0], num_slots, dtype=torch.int64, device=start.device)
    prev = start.argmax(dim=-1)
    idx[:, 0] = prev
    for s in range(num_slots - 1):
        prev = _successor_scores(pairs, s, prev).argmax(dim=-1)
        idx[:, s + 1] = prev
    return idx


def viterbi_walk(start: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """The path maximizing g (Eq. 12) exactly, in O(S K^2). Returns idx [B, S] int64.

    A backward pass computes best[s, i], the best score of any continuation from candidate i
    of slot s to the end; a forward pass then commits each slot to the lowest index that still
    attains the optimum. That yields the lexicographically smallest maximizer. Scores are
    accumulated in float64, so ties between real-valued sums of fp32 scores are resolved by
    this rule rather than by the rounding of one summation order.
    """
    num_slots = _num_slots(start, pairs)
    bsz, k = start.shape
    scores = pairs.double()
    best = torch.zeros(bsz, num_slots, k, dtype=torch.float64, device=start.device)
    for s in range(num_slots - 2, -1, -1):
        best[:, s] = (scores[:, s] + best[:, s + 1, None, :]).amax(dim=-1)

    idx = torch.empty(bsz, num_slots, dtype=torch.int64, device=start.device)
    prev = (start.double() + best[:, 0]).argmax(dim=-1)
    idx[:, 0] = prev
    for s in range(num_slots - 1):
        prev = (_successor_scores(scores, s, prev) + best[:, s + 1]).argmax(dim=-1)
        idx[:, s + 1] = prev
    return idx


def sampled_walk(
    start: torch.Tensor,
    pairs: torch.Tensor,
    temperature: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample each slot from softmax(successor scores / T) given the previous pick.

    Args:
        start [B, K], pairs [B, S-1, K, K]: the lattice scores (logits).
        temperature [B]: per-request temperature; rows with T <= 0 walk greedily.
        generator: torch.Generator on the scores' device, for reproducible draws.
    Returns:
        idx [B, S] int64 and step_probs [B, S, K] fp32, where step_probs[b, s] is exactly the
        distribution idx[b, s] was drawn from (one-hot at the greedy pick for T <= 0 rows and
        for steps whose softmax is not finite). The path probability is the product of
        step_probs[b, s, idx[b, s]] over s.
    """
    num_slots = _num_slots(start, pairs)
    bsz, k = start.shape
    if temperature.shape != (bsz,):
        raise ValueError(
            f"temperature must be [B] = [{bsz}], got shape {tuple(temperature.shape)}."
        )
    idx = torch.empty(bsz, num_slots, dtype=torch.int64, device=start.device)
    step_probs = torch.empty(bsz, num_slots, k, dtype=torch.float32, device=start.device)
    if bsz == 0:
        return idx, step_probs

    temperature = temperature.to(device=start.device, dtype=torch.float32)
    is_sampled = (temperature > 0)[:, None]
    safe_temperature = torch.where(is_sampled, temperature[:, None], 1.0)
    scores = start
    for s in range(num_slots):
        if s > 0:
            scores = _successor_scores(pairs, s - 1, idx[:, s - 1])
        logits = scores.float()
        greedy = torch.nn.functional.one_hot(logits.argmax(dim=-1), k).float()
        soft = torch.softmax(logits / safe_temperature, dim=-1)
        use_soft = is_sampled & torch.isfinite(soft).all(dim=-1, keepdim=True)
        probs = torch.where(use_soft, soft, greedy)
        idx[:, s] = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        step_probs[:, s] = probs
    return idx, step_probs


def path_score(start: torch.Tensor, pairs: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """g(idx) of Eq. 12 for each request: [B] float64 (summed in float64)."""
    num_slots = _num_slots(start, pairs)
    bsz = start.shape[0]
    if idx.shape != (bsz, num_slots):
        raise ValueError(
            f"idx must be [B, S] = [{bsz}, {num_slots}], got shape {tuple(idx.shape)}."
        )
    idx = idx.long()
    total = start.double().gather(1, idx[:, :1]).squeeze(1)
    rows = torch.arange(bsz, device=start.device)
    for s in range(num_slots - 1):
        total = total + pairs[rows, s, idx[:, s], idx[:, s + 1]].double()
    return total
