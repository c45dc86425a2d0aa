"""Training losses for the DFlash drafter and the LiLiCorr reranker.

Slot convention: the drafted slots of a block are indexed 0..S-1 here (S = block_size - 1);
slot 0 here is the paper's slot 1, the first token after the anchor. Candidates are the
drafter's top-K tokens per slot, so `candidate_ids` is [B, S, K] and the reranker scores are

    start[b, k]       anchor -> candidate k of slot 0                     (paper phi(0, anchor, k))
    pairs[b, s, i, j] candidate i of slot s -> candidate j of slot s + 1  (paper phi(s+1, i, j))

both already multiplied by the cosine scale sigma, i.e. the logits z of Eq. (2).

Every reranker term is evaluated only on the oracle prefix (the leading run of slots whose
ground-truth token is among the candidates) and averaged over all supervised slots of the
batch (|S| of Eq. 3 and 5). The DFlash term is a decay-weighted mean over its supervised slots.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

__all__ = [
    "LossWeights",
    "ground_truth_index",
    "oracle_prefix_mask",
    "slot_logits",
    "reranker_ce",
    "distractor_penalty",
    "margin_hinge",
    "dflash_ce",
    "combine_terms",
    "total_loss",
]


@dataclass(frozen=True)
class LossWeights:
    """Weights of Eq. (7) and its margin variant (Appendix G); defaults are Table 4.

    dflash_decay     beta  in w_s = exp(-(s-1)/beta) of Eq. (6)     (7.0 for block 16, 4.0 for 8)
    reranker_weight  gamma, weight of the whole reranker objective   (0.25)
    distractor       lambda, weight of the distractor penalty         (1.0)
    margin_blend     mu, share of the hinge against the hard label    (0.0; 0.5 for "+ margin")
    margin           rho, the hinge margin on the decision gap        (2.0)
    distill          share of each slot's DFlash term taken by KL(target || drafter) against the
                     teacher-forced target distribution instead of the CE on the target's token
                     (0.0 = the paper's Eq. 6; an extension for data-poor training, see
                     training/README.md)
    dflash_normalize how the DFlash term is averaged: "weight" (default) divides the batch's sum
                     of w_s CE_s by the sum of w_s over supervised slots, a weighted slot mean
                     whose scale does not depend on how many slots a block supervises; "blocks"
                     is Eq. 6 as written, each block's unnormalised sum of w_s CE_s, averaged
                     over blocks with a supervised slot (about sum_s w_s = 6.6 times larger for
                     block 16 with decay 7, so it weighs that much more against the reranker terms of Eq. 7)
    """

    dflash_decay: float = 7.0
    reranker_weight: float = 0.25
    distractor: float = 1.0
    margin_blend: float = 0.0
    margin: float = 2.0
    distill: float = 0.0
    dflash_normalize: str = "weight"

    def __post_init__(self) -> None:
        if self.dflash_normalize not in ("weight", "blocks"):
            raise ValueError(f"dflash_normalize must be 'weight' or 'blocks' (Eq. 6 as written), got "
                             f"{self.dflash_normalize!r}")
        if not self.dflash_decay > 0:
            raise ValueError(f"dflash_decay must be > 0 (got {self.dflash_decay}); use 7.0 for block 16")
        for name in ("reranker_weight", "distractor", "margin"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (got {getattr(self, name)})")
        if not 0.0 <= self.distill <= 1.0:
            raise ValueError(f"distill must be in [0, 1] (got {self.distill})")
        if not 0.0 <= self.margin_blend <= 1.0:
            raise ValueError(f"margin_blend (mu) must be in [0, 1] (got {self.margin_blend})")

    @classmethod
    def with_margin(cls, **overrides: float) -> "LossWeights":
        """The "LiLiCorr + margin" setting of Appendix G: mu = 0.5, rho = 2.0."""
        return cls(**{"margin_blend": 0.5, "margin": 2.0, **overrides})

    def to_dict(self) -> dict[str, float | str]:
        return asdict(self)


def _check_same_leading(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(tensor.shape[: len(shape)]) != shape:
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected leading dims {shape}")


def ground_truth_index(candidate_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Position of each slot's target among its candidates.

    candidate_ids: [B, S, K] int; targets: [B, S] int (negative = no target).
    Returns [B, S] int64: the first k with candidate_ids[b, s, k] == targets[b, s], else -1.
    """
    _check_same_leading("targets", targets, tuple(candidate_ids.shape[:2]))
    hits = candidate_ids == targets.unsqueeze(-1)
    first = hits.to(torch.int64).argmax(dim=-1)
    return torch.where(hits.any(dim=-1), first, torch.full_like(first, -1))


def oracle_prefix_mask(candidate_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The oracle prefix: the leading run of slots whose target is among the candidates.

    candidate_ids: [B, S, K] int; targets: [B, S] int. A negative target (an unsupervised
    slot, e.g. past the end of the sequence or outside the loss mask) never matches, so it
    ends the prefix like a coverage miss. Returns bool [B, S].
    """
    _check_same_leading("targets", targets, tuple(candidate_ids.shape[:2]))
    covered = (candidate_ids == targets.unsqueeze(-1)).any(dim=-1)
    return covered.to(torch.int64).cumprod(dim=-1).bool()


def _check_reranker_inputs(
    start: torch.Tensor, pairs: torch.Tensor, gt_index: torch.Tensor, mask: torch.Tensor
) -> None:
    if start.dim() != 2:
        raise ValueError(f"start must be [B, K], got shape {tuple(start.shape)}")
    batch, k = start.shape
    if gt_index.dim() != 2 or gt_index.shape[0] != batch:
        raise ValueError(f"gt_index must be [B={batch}, S], got shape {tuple(gt_index.shape)}")
    slots = gt_index.shape[1]
    if tuple(pairs.shape) != (batch, slots - 1, k, k):
        raise ValueError(
            f"pairs has shape {tuple(pairs.shape)}, expected [B, S-1, K, K] = {(batch, slots - 1, k, k)}"
        )
    if mask.dtype != torch.bool or tuple(mask.shape) != (batch, slots):
        raise ValueError(f"mask must be bool [B, S] = {(batch, slots)}, got {mask.dtype} {tuple(mask.shape)}")
    supervised = gt_index[mask]
    if supervised.numel() and (supervised.min() < 0 or supervised.max() >= k):
        raise ValueError("gt_index must be in [0, K) on every masked slot; pass mask = oracle_prefix_mask(...)")
    if slots > 1:
        predecessor = gt_index[:, :-1][mask[:, 1:]]
        if predecessor.numel() and (predecessor.min() < 0 or predecessor.max() >= k):
            raise ValueError(
                "a masked slot needs a covered predecessor (teacher forcing); mask must be a prefix "
                "such as oracle_prefix_mask(...)"
            )


def slot_logits(start: torch.Tensor, pairs: torch.Tensor, gt_index: torch.Tensor) -> torch.Tensor:
    """Teacher-forced per-slot logits z_s[k] = phi(s-1, g_{s-1}, k) of Eq. (2).

    start [B, K], pairs [B, S-1, K, K], gt_index [B, S] -> [B, S, K] (float32). Slot 0 is
    scored from the anchor; slot s >= 1 from the ground-truth candidate of slot s-1 (index
    clamped to 0 where there is none; such slots must be masked out by the caller).
    """
    start = start.float()
    if pairs.shape[1] == 0:
        return start.unsqueeze(1)
    k = start.shape[-1]
    previous = gt_index[:, :-1].clamp(min=0)
    rows = pairs.float().gather(2, previous[:, :, None, None].expand(-1, -1, 1, k)).squeeze(2)
    return torch.cat([start.unsqueeze(1), rows], dim=1)


def _masked_mean(per_slot: torch.Tensor, mask: torch.Tensor,
                 slot_weights: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over masked entries, weighted per slot by `slot_weights` [S] if given (sum of w_s x
    term over the sum of w_s); zero (still attached to the graph) when none are masked."""
    if slot_weights is None:
        count = mask.sum()
        total = torch.where(mask, per_slot, torch.zeros_like(per_slot)).sum()
        return total / count.clamp(min=1).to(total.dtype)
    weight = torch.where(mask, slot_weights.to(per_slot.device, per_slot.dtype), 0.0)
    total = (weight * torch.where(mask, per_slot, torch.zeros_like(per_slot))).sum()
    return total / weight.sum().clamp(min=1e-12)


def _supervised_log_probs(
    start: torch.Tensor, pairs: torch.Tensor, gt_index: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_reranker_inputs(start, pairs, gt_index, mask)
    logits = slot_logits(start, pairs, gt_index)
    log_probs = logits.log_softmax(dim=-1)
    gt = gt_index.clamp(min=0).unsqueeze(-1)
    return logits, log_probs, gt


def reranker_ce(
    start: torch.Tensor, pairs: torch.Tensor, gt_index: torch.Tensor, mask: torch.Tensor,
    slot_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """L_CE of Eq. (3): mean over masked slots of -log P(c_s = g_s | c_{s-1} = g_{s-1}).

    start [B, K] and pairs [B, S-1, K, K] are logits (sigma * cosine); gt_index [B, S] int64;
    mask [B, S] bool (the oracle prefix). Returns a float32 scalar.
    """
    _, log_probs, gt = _supervised_log_probs(start, pairs, gt_index, mask)
    nll = -log_probs.gather(-1, gt).squeeze(-1)
    return _masked_mean(nll, mask, slot_weights)


def distractor_penalty(
    start: torch.Tensor,
    pairs: torch.Tensor,
    gt_index: torch.Tensor,
    target_logq: torch.Tensor,
    mask: torch.Tensor,
    slot_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """L_dist of Eq. (4)-(5): mean over masked slots of sum_k P(k) relu(log q_g - log q_k).

    target_logq [B, S, K]: the target's log-probability of each candidate at that slot, from
    the teacher-forced target pass; it is a constant here (no gradient reaches the target).
    """
    _check_same_leading("target_logq", target_logq, tuple(gt_index.shape) + (start.shape[-1],))
    _, log_probs, gt = _supervised_log_probs(start, pairs, gt_index, mask)
    logq = target_logq.detach().float()
    cost = F.relu(logq.gather(-1, gt) - logq)
    penalty = (log_probs.exp() * cost).sum(dim=-1)
    return _masked_mean(penalty, mask, slot_weights)


def margin_hinge(
    start: torch.Tensor,
    pairs: torch.Tensor,
    gt_index: torch.Tensor,
    mask: torch.Tensor,
    rho: float,
    slot_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """L_margin of Eq. (13): mean over masked slots of relu(rho - (z_g - max_{k != g} z_k))."""
    logits, _, gt = _supervised_log_probs(start, pairs, gt_index, mask)
    if logits.shape[-1] == 1:  # a single candidate has no competitor: the gap is infinite
        return _masked_mean(torch.zeros_like(logits[..., 0]), mask, slot_weights) + 0.0 * logits.sum()
    is_gt = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, gt, True)
    best_other = logits.masked_fill(is_gt, float("-inf")).amax(dim=-1)
    gap = logits.gather(-1, gt).squeeze(-1) - best_other
    return _masked_mean(F.relu(rho - gap), mask, slot_weights)


def dflash_ce(
    logits: torch.Tensor, targets: torch.Tensor, decay: float, mask: torch.Tensor
) -> torch.Tensor:
    """L_DFlash of Eq. (6) as a decay-weighted mean: sum w_s CE_s / sum w_s over masked slots.

    logits [B, S, V] (any float dtype; the CE is computed in float32); targets [B, S] int;
    mask [B, S] bool; w_s = exp(-s / decay) for slot index s = 0..S-1 (the paper's k-1).
    Normalizing by the weight mass keeps the loss scale independent of how many slots a
    batch supervises.
    """
    total, weight = _dflash_ce_sum(logits, targets, decay, mask)
    return total / weight.clamp(min=torch.finfo(torch.float32).tiny)


def _dflash_ce_sum(
    logits: torch.Tensor, targets: torch.Tensor, decay: float, mask: torch.Tensor,
    teacher_logits: torch.Tensor | None = None, distill: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, S, V], got shape {tuple(logits.shape)}")
    _check_same_leading("targets", targets, tuple(logits.shape[:2]))
    _check_same_leading("mask", mask, tuple(logits.shape[:2]))
    if not decay > 0:
        raise ValueError(f"decay must be > 0 (got {decay}); use 7.0 for block size 16")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be bool, got {mask.dtype}")
    slots = logits.shape[1]
    weight = torch.exp(-torch.arange(slots, device=logits.device, dtype=torch.float32) / decay)
    weight = weight.expand_as(mask) * mask
    log_probs = logits.float().log_softmax(dim=-1)
    ce = -log_probs.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    if teacher_logits is not None and distill > 0:
        if teacher_logits.shape != logits.shape:
            raise ValueError(f"teacher_logits has shape {tuple(teacher_logits.shape)}, expected the "
                             f"draft logits' {tuple(logits.shape)}")
        teacher = teacher_logits.float().log_softmax(dim=-1)
        kl = (teacher.exp() * (teacher - log_probs)).sum(dim=-1)
        ce = (1.0 - distill) * ce + distill * kl
    return (ce * weight).sum(), weight.sum()


def combine_terms(
    terms: dict[str, torch.Tensor],
    weights: LossWeights,
    dflash_scale: float | torch.Tensor = 1.0,
    reranker_scale: float | torch.Tensor = 1.0,
) -> torch.Tensor:
    """L = s_d L_DFlash + gamma s_r [(1 - mu) L_CE + lambda L_dist + mu L_margin].

    The scales exist for data parallelism: with s = local denominator / mean denominator
    across ranks, averaging the ranks' gradients gives exactly the gradient of the global
    slot-mean (see training/trainer.py). Single-process training uses 1.0.
    """
    loss = dflash_scale * terms["dflash"]
    if "ce" in terms:
        reranker = (1.0 - weights.margin_blend) * terms["ce"]
        if "distractor" in terms:
            reranker = reranker + weights.distractor * terms["distractor"]
        if "margin" in terms:
            reranker = reranker + weights.margin_blend * terms["margin"]
        loss = loss + reranker_scale * weights.reranker_weight * reranker
    return loss


def total_loss(
    *,
    draft_logits: torch.Tensor,
    targets: torch.Tensor,
    slot_mask: torch.Tensor,
    weights: LossWeights = LossWeights(),
    candidate_ids: torch.Tensor | None = None,
    start: torch.Tensor | None = None,
    pairs: torch.Tensor | None = None,
    target_logq: torch.Tensor | None = None,
    teacher_logits: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Eq. (7) and its margin variant:
        L = L_DFlash + gamma [(1 - mu) L_CE + lambda L_dist + mu L_margin].

    draft_logits [B, S, V]; targets [B, S]; slot_mask [B, S] bool (slots with a real,
    loss-masked target). Without `start` the reranker is absent and L = L_DFlash (plain DFlash
    training). With it, candidate_ids [B, S, K], pairs [B, S-1, K, K] and, when lambda > 0,
    target_logq [B, S, K] are required. teacher_logits [B, S, V] (the teacher-forced target's
    logits for the same slots) are required when weights.distill > 0. Returns float32 tensors: "loss" (differentiable),
    the unweighted terms "dflash", "ce", "distractor", "margin", and the denominators
    "dflash_weight" (the DFlash term's denominator: the decay-weight mass, or the number of
    supervised blocks with dflash_normalize "blocks") and "oracle_slots" (|S| of Eq. 3).
    """
    targets = torch.where(slot_mask, targets, torch.full_like(targets, -1))
    if weights.distill > 0 and teacher_logits is None:
        raise ValueError("teacher_logits are required when weights.distill > 0")
    dflash_sum, denominator = _dflash_ce_sum(draft_logits, targets, weights.dflash_decay, slot_mask,
                                             teacher_logits, weights.distill)
    if weights.dflash_normalize == "blocks":
        denominator = slot_mask.any(dim=-1).sum().float()
    terms = {
        "dflash": dflash_sum / denominator.clamp(min=torch.finfo(torch.float32).tiny),
        "dflash_weight": denominator.detach(),
    }
    if start is not None:
        if candidate_ids is None or pairs is None:
            raise ValueError("total_loss with a reranker needs candidate_ids and pairs as well as start")
        oracle = oracle_prefix_mask(candidate_ids, targets)
        gt_index = ground_truth_index(candidate_ids, targets)
        terms["ce"] = reranker_ce(start, pairs, gt_index, oracle)
        if weights.distractor > 0:
            if target_logq is None:
                raise ValueError("target_logq is required when weights.distractor (lambda) > 0")
            terms["distractor"] = distractor_penalty(start, pairs, gt_index, target_logq, oracle)
        if weights.margin_blend > 0:
            terms["margin"] = margin_hinge(start, pairs, gt_index, oracle, weights.margin)
        terms["oracle_slots"] = oracle.sum().float()
    terms["loss"] = combine_terms(terms, weights)
    return terms
