"""One training forward: drafter (+ optional LiLiCorr head) on a batch of sequences -> losses.

Inputs per batch (B sequences of padded length T):
  input_ids [B, T] int64, loss_mask [B, T] bool (assistant tokens; False on padding),
  target_taps [B, T, H * n_taps]: target hidden states at the drafter's target_layer_ids,
  target_final_hidden [B, T, H] (optional): the target's final normed hidden state, from which
      the frozen LM head gives the teacher-forced target distribution (distractor penalty),
  seeds: one int per sequence (anchor sampling, see blocks.py).

The LiLiCorr head is fed exactly what the vLLM speculator feeds it at serving time:
  token_embeddings    target input embeddings of the top-K candidate ids,
  candidate_log_probs the drafter's full-vocabulary log-probs of the candidates (rank-sorted),
  pass_hidden         the drafter's final-normed hidden state of each slot,
  anchor_hidden       hidden_norm(fc(taps)) at the position before the anchor, i.e. the
                      context state of the last verified token,
  anchor_valid        True (every training anchor has context).
Candidate ids are chosen without gradient; gradients reach the drafter through the candidate
log-probs, the slot hidden states and the anchor state.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from training.blocks import block_windows, build_blocks, sample_anchors
from training.drafter import DFlashDrafter
from training.losses import LossWeights, combine_terms, total_loss
from vllm_liliprop.heads.candidates import topk_candidates
from vllm_liliprop.heads.lattice import LatticeHead
from vllm_liliprop.heads.lattice_prior import with_logprob_prior
from vllm_liliprop.walks import greedy_walk

__all__ = ["DraftObjective", "accepted_prefix_length", "true_token_rank", "vocab_positions"]


def accepted_prefix_length(draft_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """[M, S] proposed ids vs [M, S] ground truth (-1 = none) -> [M] length of the leading
    run of matches: the number of drafted tokens a greedy verifier would accept."""
    hits = (draft_ids == targets) & (targets >= 0)
    return hits.to(torch.int64).cumprod(dim=-1).sum(dim=-1)


def true_token_rank(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """[..., V] scores and [...] true ids (-1 = none) -> [...] int64: the true token's place in
    the order argmax and top-K take (score descending, lower index first among ties, as
    torch.argmax and `topk_candidates`), so rank 0 is exactly an argmax hit. V where there is
    no true token: it is then within no top-K."""
    vocab = logits.shape[-1]
    true = logits.gather(-1, targets.clamp(min=0).unsqueeze(-1))
    earlier = torch.arange(vocab, device=logits.device) < targets.unsqueeze(-1)
    rank = ((logits > true) | ((logits == true) & earlier)).sum(dim=-1)
    return torch.where(targets >= 0, rank, torch.full_like(rank, vocab))


def vocab_positions(vocab_ids, vocab_size: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A training vocabulary's ids (int64 [N]) and the map token id -> its index in them (-1
    outside): labels are scored over those ids only."""
    vocab_ids = torch.as_tensor(vocab_ids, dtype=torch.int64, device=device)
    if vocab_ids.dim() != 1 or vocab_ids.unique().numel() != vocab_ids.numel() or (
            vocab_ids.numel() and not 0 <= int(vocab_ids.min()) <= int(vocab_ids.max()) < vocab_size):
        raise ValueError(f"vocab_ids must be distinct token ids in [0, {vocab_size})")
    position = torch.full((vocab_size,), -1, dtype=torch.int64, device=device)
    position[vocab_ids] = torch.arange(vocab_ids.numel(), device=device)
    return vocab_ids, position


class DraftObjective(nn.Module):
    """Drafter (+ LiLiCorr head) with the frozen target embedding table and LM head.

    The frozen target weights are non-persistent buffers: they never enter the optimizer,
    checkpoints or exports (vLLM shares them from the target at load time).
    """

    def __init__(
        self,
        drafter: DFlashDrafter,
        embed_weight: torch.Tensor,
        lm_head_weight: torch.Tensor,
        *,
        lattice: LatticeHead | None = None,
        correction: nn.Module | None = None,
        weights: LossWeights = LossWeights(),
        num_anchors: int = 512,
        vocab_ids: torch.Tensor | None = None,
        slot_outcomes: bool = False,
    ) -> None:
        super().__init__()
        cfg = drafter.config
        if tuple(embed_weight.shape) != (cfg.vocab_size, cfg.hidden_size):
            raise ValueError(
                f"embed_weight has shape {tuple(embed_weight.shape)}, expected "
                f"[vocab_size, hidden_size] = {(cfg.vocab_size, cfg.hidden_size)}"
            )
        if tuple(lm_head_weight.shape) != (cfg.vocab_size, cfg.hidden_size):
            raise ValueError(
                f"lm_head_weight has shape {tuple(lm_head_weight.shape)}, expected "
                f"{(cfg.vocab_size, cfg.hidden_size)}"
            )
        if lattice is not None:
            lat = lattice.config
            if lat.block_size != cfg.block_size or lat.model_hidden_size != cfg.hidden_size:
                raise ValueError(
                    f"lattice config (block_size {lat.block_size}, model_hidden_size "
                    f"{lat.model_hidden_size}) must match the drafter (block_size {cfg.block_size}, "
                    f"hidden_size {cfg.hidden_size})"
                )
        if lattice is not None and correction is not None:
            raise ValueError("a draft has either a LiLiCorr head or a sequential correction head "
                             "(DSpark, Domino), not both")
        self.drafter = drafter
        self.lattice = lattice
        self.correction = correction
        self.weights = weights
        self.num_anchors = num_anchors
        # Measurement only (the measure stage's headroom): per-slot [M, S] tensors in the terms
        # ("true_rank", "slot_valid", "walk_hit"); off in training, where they would cost a pass
        # over [M, S, V] and the trainer logs scalars only. A true token outside the training
        # vocabulary ranks V there (a miss at every K), as in a reduced-vocabulary draft's serving.
        self.slot_outcomes = slot_outcomes
        self.register_buffer("embed_weight", embed_weight.detach(), persistent=False)
        # The training vocabulary (an extension for CPU budgets): every softmax of the loss runs
        # over these rows of the LM head only, and labels outside them are not supervised. The
        # export is unchanged; vLLM drafts over the full vocabulary.
        if vocab_ids is None:
            self.vocab_ids = None
        else:
            vocab_ids, position = vocab_positions(vocab_ids, cfg.vocab_size, lm_head_weight.device)
            self.register_buffer("vocab_ids", vocab_ids, persistent=False)
            self.register_buffer("vocab_position", position, persistent=False)
            lm_head_weight = lm_head_weight[vocab_ids]
        self.register_buffer("lm_head_weight", lm_head_weight.detach(), persistent=False)

    def target_log_probs(self, final_hidden: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """log softmax(lm_head(final_hidden)) at `ids`: [..., H], [..., K] -> [..., K] fp32."""
        logits = F.linear(final_hidden.float(), self.lm_head_weight.float())
        return logits.log_softmax(dim=-1).gather(-1, ids)

    def full_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Training-vocabulary indices -> token ids (identity without a training vocabulary)."""
        return ids if self.vocab_ids is None else self.vocab_ids[ids]

    def _train_labels(self, targets: torch.Tensor, slot_mask: torch.Tensor):
        if self.vocab_ids is None:
            return targets, slot_mask
        mapped = torch.where(targets >= 0, self.vocab_position[targets.clamp(min=0)], targets)
        return mapped, slot_mask & (mapped >= 0)

    @staticmethod
    def _slot_states(states: torch.Tensor, anchors: torch.Tensor, valid: torch.Tensor,
                     slots: int) -> torch.Tensor:
        """[B, T, H] target states -> [M, S, H] at the positions that predict each slot: slot s
        of anchor a is the token at a + 1 + s, predicted by the target at a + s."""
        return block_windows(states, anchors, slots)[valid]

    def draft_blocks(self, input_ids: torch.Tensor, loss_mask: torch.Tensor, target_taps: torch.Tensor,
                     seeds: Sequence[int]) -> dict[str, torch.Tensor]:
        """The drafter over a batch's anchor blocks: anchors [B, A] and valid [B, A]; per valid
        block (M of them) targets and slot_mask [M, S] (training-vocabulary labels),
        slot_hidden [M, S, H], draft_logits [M, S, V'], anchor_hidden [M, H] (the context state
        before the anchor, the LiLiCorr head's anchor input)."""
        cfg = self.drafter.config
        anchors, valid = sample_anchors(loss_mask, self.num_anchors, seeds)
        block_ids, targets, slot_mask = build_blocks(
            input_ids, loss_mask, anchors, valid, cfg.block_size, cfg.mask_token_id
        )
        context = self.drafter.context_states(target_taps.to(self.drafter.fc.weight.dtype))
        hidden = self.drafter(F.embedding(block_ids, self.embed_weight), context, anchors)
        slot_hidden = hidden[:, :, 1:][valid]  # [M, S, H]
        slot_valid = slot_mask[valid]  # before the training vocabulary drops labels outside it
        targets, slot_mask = self._train_labels(targets[valid], slot_mask[valid])
        before_anchor = (anchors - 1).unsqueeze(-1).expand(-1, -1, context.shape[-1])
        return {"anchors": anchors, "valid": valid, "targets": targets, "slot_mask": slot_mask,
                "slot_valid": slot_valid, "slot_hidden": slot_hidden,
                "draft_logits": F.linear(slot_hidden, self.lm_head_weight),  # [M, S, V]
                "anchor_hidden": context.gather(1, before_anchor)[valid]}

    def forward(
        self,
        input_ids: torch.Tensor,
        loss_mask: torch.Tensor,
        target_taps: torch.Tensor,
        seeds: Sequence[int],
        target_final_hidden: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        draft = self.draft_blocks(input_ids, loss_mask, target_taps, seeds)
        anchors, valid, targets, slot_mask = draft["anchors"], draft["valid"], draft["targets"], draft["slot_mask"]
        slot_hidden, draft_logits = draft["slot_hidden"], draft["draft_logits"]
        metrics = {}
        if self.correction is not None:
            # Teacher forcing: each slot is corrected from the true token before it, which is
            # what the sequential head consumes at serving time whenever the block is accepted.
            with torch.no_grad():
                metrics["accept_base"] = accepted_prefix_length(
                    draft_logits.detach().argmax(dim=-1), targets).float().mean()
            prev_ids = self._slot_states(input_ids.unsqueeze(-1), anchors, valid, targets.shape[1])[..., 0]
            draft_logits = draft_logits + self.correction.teacher_forced(prev_ids, slot_hidden).to(
                draft_logits.dtype)
        if self.weights.distill > 0 and target_final_hidden is None:
            raise ValueError("target_final_hidden is required for distillation (weights.distill > 0); "
                             "compute features with final_hidden=True")
        teacher_logits = None
        if self.weights.distill > 0:
            with torch.no_grad():
                # In the LM head's dtype: a bf16 target under fp32 training (autocast casts both
                # operands itself, so bf16 training computes exactly as before).
                teacher_logits = F.linear(
                    self._slot_states(target_final_hidden, anchors, valid, targets.shape[1]).to(
                        self.lm_head_weight.dtype),
                    self.lm_head_weight)

        lattice_inputs = {}
        if self.lattice is not None:
            blocks, slots = targets.shape
            k = self.lattice.config.candidate_topk
            with torch.no_grad():
                candidate_ids, _ = topk_candidates(draft_logits.detach().flatten(0, 1), k)
            candidate_ids = candidate_ids.view(blocks, slots, k)
            candidate_log_probs = draft_logits.float().log_softmax(dim=-1).gather(-1, candidate_ids)
            anchor_hidden = draft["anchor_hidden"]  # [M, H]
            start, pairs = self.lattice.score(
                F.embedding(self.full_ids(candidate_ids), self.embed_weight),
                candidate_log_probs,
                slot_hidden,
                anchor_hidden,
                torch.ones(blocks, dtype=torch.bool, device=anchor_hidden.device),
            )
            start, pairs = with_logprob_prior(start, pairs, candidate_log_probs, self.lattice.config.prior_weight)
            target_logq = None
            if self.weights.distractor > 0:
                if target_final_hidden is None:
                    raise ValueError(
                        "target_final_hidden is required for the distractor penalty "
                        "(weights.distractor > 0); compute features with final_hidden=True"
                    )
                with torch.no_grad():
                    target_logq = self.target_log_probs(
                        self._slot_states(target_final_hidden, anchors, valid, slots), candidate_ids)
            lattice_inputs = dict(
                candidate_ids=candidate_ids, start=start, pairs=pairs, target_logq=target_logq
            )
            with torch.no_grad():
                walk = candidate_ids.gather(-1, greedy_walk(start.detach(), pairs.detach()).unsqueeze(-1))
                metrics["accept_walk"] = accepted_prefix_length(walk.squeeze(-1), targets).float().mean()
                if self.slot_outcomes:
                    metrics["walk_hit"] = (walk.squeeze(-1) == targets) & (targets >= 0)

        terms = total_loss(
            draft_logits=draft_logits,
            targets=targets,
            slot_mask=slot_mask,
            weights=self.weights,
            teacher_logits=teacher_logits,
            **lattice_inputs,
        )
        with torch.no_grad():
            argmax_draft = draft_logits.detach().argmax(dim=-1)
            metrics["accept_argmax"] = accepted_prefix_length(argmax_draft, targets).float().mean()
            supervised = slot_mask.sum().clamp(min=1)
            metrics["slot_accuracy"] = ((argmax_draft == targets) & slot_mask).sum() / supervised
            metrics["blocks"] = torch.tensor(float(targets.shape[0]), device=targets.device)
            if self.slot_outcomes:
                metrics["true_rank"] = true_token_rank(draft_logits.detach(), targets)
                metrics["slot_valid"] = draft["slot_valid"]
        terms.update(metrics)
        return terms

    def loss_for_ranks(self, terms: dict[str, torch.Tensor], mean_over_ranks) -> torch.Tensor:
        """The loss rescaled for data parallelism: each term's local mean times
        (local denominator / mean denominator over ranks). Averaging the ranks' gradients then
        yields the gradient of the slot-mean over the global batch, exactly as one process
        holding the whole batch would compute it."""
        tiny = torch.finfo(torch.float32).tiny
        dflash_scale = terms["dflash_weight"] / mean_over_ranks(terms["dflash_weight"]).clamp(min=tiny)
        reranker_scale = 1.0
        if "oracle_slots" in terms:
            reranker_scale = terms["oracle_slots"] / mean_over_ranks(terms["oracle_slots"]).clamp(min=tiny)
        return combine_terms(terms, self.weights, dflash_scale, reranker_scale)
