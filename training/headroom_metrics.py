"""How much acceptance a better pick among the drafter's own candidates could buy (issue 33).

Teacher-forced, per block of S drafted slots, from the rank of the true token at every slot in
the drafter's order (0 = its argmax; `objective.true_token_rank`) and which slots have a true
token at all:

| metric | per block | reported |
|---|---|---|
| argmax tau | leading slots whose true token is the argmax (rank 0) | 1 + mean |
| oracle tau @K | leading slots whose true token is within the top K: a draft allowed to pick the true token whenever the drafter ranked it within K | 1 + mean, K in `KS` |
| walk tau | leading slots the lattice walk got right (given as hits) | 1 + mean |
| walk share @K | (walk tau - argmax tau) / (oracle tau @K - argmax tau): how much of the top-K headroom the walk took | None where there is no headroom (K = 1) |
| slot acceptance | slot s: P(argmax right at s, given right at every slot before it) | one value per slot, with the blocks it is over |

A slot with no true token (past the end of the reply) is a miss everywhere, as in tau.

tau is the measure stage's (1 + mean accepted drafts per block), so oracle @1 is its argmax tau.
Pure torch: no drafter, no target, no data here.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["KS", "accepted_lengths", "slot_acceptance", "headroom_metrics", "rounded", "headroom_table"]

KS = (1, 2, 4, 8, 16)


def accepted_lengths(hits: torch.Tensor) -> torch.Tensor:
    """bool [M, S] per-slot hits -> int64 [M]: the number of leading hits."""
    return hits.to(torch.int64).cumprod(dim=-1).sum(dim=-1)


def _tau(hits: torch.Tensor) -> float:
    return 1.0 + float(accepted_lengths(hits).float().mean()) if hits.shape[0] else float("nan")


def _share(walk: float, argmax: float, oracle: float) -> float | None:
    headroom = oracle - argmax
    return (walk - argmax) / headroom if headroom > 0 else None


def slot_acceptance(hits: torch.Tensor) -> tuple[list[float | None], list[int]]:
    """Per slot s: P(hit at s | hits at every slot before s) and the number of blocks that
    reached s. A slot past the end of the data is a miss, as in tau (serving stops at the
    end-of-turn token), so the running products of the rates sum to the mean accepted length."""
    reached = torch.cat([torch.ones_like(hits[:, :1]), hits.to(torch.int64).cumprod(dim=-1)[:, :-1].bool()], dim=-1)
    counts = reached.sum(dim=0)
    accepted = (reached & hits).sum(dim=0)
    rates = [float(a) / float(c) if c else None for a, c in zip(accepted, counts)]
    return rates, [int(c) for c in counts]


def headroom_metrics(true_rank: torch.Tensor, slot_valid: torch.Tensor, walk_hit: torch.Tensor | None = None,
                     ks: tuple[int, ...] = KS) -> dict[str, Any]:
    """true_rank int [M, S] (any value where invalid), slot_valid bool [M, S], walk_hit bool
    [M, S] or None -> the table above as a JSON-ready dict (K as string keys)."""
    if true_rank.shape != slot_valid.shape or (walk_hit is not None and walk_hit.shape != true_rank.shape):
        raise ValueError(f"true_rank {tuple(true_rank.shape)}, slot_valid {tuple(slot_valid.shape)} and "
                         f"walk_hit {None if walk_hit is None else tuple(walk_hit.shape)} must have one shape")
    slot_valid = slot_valid.bool()
    argmax_hits = slot_valid & (true_rank == 0)
    oracle = {k: _tau(slot_valid & (true_rank < k)) for k in ks}
    rates, counts = slot_acceptance(argmax_hits)
    metrics: dict[str, Any] = {"blocks": int(true_rank.shape[0]), "argmax_tau": _tau(argmax_hits),
                               "oracle_tau": {str(k): tau for k, tau in oracle.items()},
                               "slot_acceptance": rates, "slot_blocks": counts}
    if walk_hit is not None:
        walk = _tau(slot_valid & walk_hit.bool())
        metrics["walk_tau"] = walk
        metrics["walk_share"] = {str(k): _share(walk, metrics["argmax_tau"], tau) for k, tau in oracle.items()}
    return metrics


def rounded(metrics: dict[str, Any], digits: int = 4) -> dict[str, Any]:
    """The same dict with every float rounded (for manifests)."""
    if isinstance(metrics, dict):
        return {k: rounded(v, digits) for k, v in metrics.items()}
    if isinstance(metrics, list):
        return [rounded(v, digits) for v in metrics]
    return round(metrics, digits) if isinstance(metrics, float) else metrics


def headroom_table(metrics: dict[str, Any]) -> str:
    """Rows argmax, walk (with a head), oracle@K: tau and the walk's share of that K's
    headroom; then the argmax's per-slot conditional acceptance."""
    def share(k):
        value = metrics.get("walk_share", {}).get(k)
        return "" if value is None else f"{value:.3f}"

    lines = [f"{'row':<10} {'tau':>7} {'walk share':>11}", f"{'argmax':<10} {metrics['argmax_tau']:>7.3f}"]
    if "walk_tau" in metrics:
        lines.append(f"{'walk':<10} {metrics['walk_tau']:>7.3f}")
    lines += [f"{'oracle@' + k:<10} {tau:>7.3f} {share(k):>11}" for k, tau in metrics["oracle_tau"].items()]
    lines.append(f"argmax per-slot conditional acceptance ({metrics['blocks']} blocks):")
    lines += [f"  slot {s}: {'-' if rate is None else f'{rate:.3f}'} over {n} blocks"
              for s, (rate, n) in enumerate(zip(metrics["slot_acceptance"], metrics["slot_blocks"]))]
    return "\n".join(lines)
