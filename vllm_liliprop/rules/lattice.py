"""LiLiCorr: top-K candidates per slot, the lattice head's transition scores, then a walk."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_liliprop.faults import non_finite_rows
from vllm_liliprop.heads.candidates import topk_candidates_reference
from vllm_liliprop.heads.lattice import LatticeConfig, LatticeHead
from vllm_liliprop.heads.lattice_prior import with_logprob_prior
from vllm_liliprop.heads.lattice_serving import ServingLatticeHead
from vllm_liliprop.kernels import greedy_walk, topk_candidates, viterbi_walk
from vllm_liliprop.options import LiliPropOptions
from vllm_liliprop.rules.base import DraftInputs, DraftOutput, scored_logits
from vllm_liliprop.walks import GREEDY_TEMPERATURE, path_score, sampled_walk


@dataclass
class Lattice:
    candidate_ids: torch.Tensor  # [B, S, K] int64
    start: torch.Tensor  # [B, K] fp32
    pairs: torch.Tensor  # [B, S-1, K, K] fp32
    log_probs: torch.Tensor  # [B, S, K] fp32: the drafter's log-probs of the candidates

    def top1_ids(self) -> torch.Tensor:
        """[B, S]: each slot's best candidate, i.e. the drafter's argmax (ties to the lowest id)."""
        return self.candidate_ids[..., 0]


def walk_faults(start: torch.Tensor, pairs: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """[B] bool: NaN/+inf anywhere in the scores the walk ran on, or a walked path that scores
    -inf or NaN (`faults.non_finite_rows`). Pass the scores the walk saw, terms added by the
    rule included (lattice+DeLS), since those are where a head's fault shows up.

    The path's terms are checked one by one (`chosen_scores`, one gather) rather than summed:
    the same rows. With no NaN/+inf in the scores (else the row is flagged either way), every
    term is finite or -inf, and their float64 sum (`path_score`, which cannot overflow for
    fp32 terms) is -inf exactly when some term is."""
    return non_finite_rows(start, pairs, chosen=chosen_scores(start, pairs, index))


def walk_faults_reference(start: torch.Tensor, pairs: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`walk_faults` on the float64 path score, as first written (tests compare the two)."""
    return non_finite_rows(start, pairs, chosen=path_score(start, pairs, index))


def chosen_scores(start: torch.Tensor, pairs: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """[B, S]: the terms of the walked path's score, start[b, i_0], pairs[b, s, i_s, i_{s+1}]."""
    first = start.gather(1, index[:, :1])
    if index.shape[1] == 1:
        return first
    k = start.shape[1]
    steps = pairs.flatten(2).gather(2, (index[:, :-1] * k + index[:, 1:]).unsqueeze(-1))
    return torch.cat([first, steps.squeeze(-1).to(first.dtype)], dim=1)


def sampling_temperature(inputs: DraftInputs, sampling: str) -> torch.Tensor | None:
    """Per-request temperatures when drafts are sampled, else None (deterministic drafts)."""
    if sampling != "probabilistic" or inputs.temperature is None:
        return None
    t = inputs.temperature.float()
    return torch.where(t < GREEDY_TEMPERATURE, torch.zeros_like(t), t)


def load_lattice_head(resources) -> LatticeHead:
    """Our `LatticeHead` with the weights vLLM loaded from a `LiLiCorrDraftModel` checkpoint."""
    config = LatticeConfig.from_dflash_config(
        resources.dflash_config, resources.draft_hidden_size, resources.block_size,
        resources.rms_norm_eps,
    )
    if config.candidate_topk > resources.vocab_size:
        raise ValueError(
            f"dflash_config.lilicorr_candidate_topk = {config.candidate_topk} exceeds the "
            f"vocabulary ({resources.vocab_size}); use a smaller power of two."
        )
    if resources.embed_weight is not None and resources.embed_weight.shape[1] != config.model_hidden_size:
        raise ValueError(
            f"the target's embedding width {resources.embed_weight.shape[1]} does not match the "
            f"LiLiCorr head's token input width (draft hidden_size {config.model_hidden_size}); "
            "the head must be trained for this target."
        )
    if resources.lattice_state_dict is None:
        raise ValueError("the LiLiCorr checkpoint has no head weights (lilicorr.*)")
    head = LatticeHead(config)
    head.load_state_dict(resources.lattice_state_dict, strict=True)
    return head.to(device=resources.device, dtype=resources.dtype).eval()


class LatticeRule:
    """Top-K candidates, the lattice head's scores, a walk.

    Served through `ServingLatticeHead`, the fast top-K path and the one-gather fault test;
    `reference=True` runs the path as first written (`LatticeHead.score`,
    `topk_candidates_reference` on CPU, `walk_faults_reference`): the same drafts, kept for the
    tests and tools/lattice_cpu_bench.py to compare against.
    """

    needs_anchor_hidden = True

    def __init__(self, head: LatticeHead, vocab_size: int, walk: str = "greedy",
                 sampling: str = "deterministic", reference: bool = False,
                 reports_confidence: bool = False, vocab_ids: torch.Tensor | None = None):
        self.head = head
        self.vocab_size = vocab_size
        # Ascending target ids the candidates come from (heads/candidate_vocab.py), or None: all.
        self.vocab_ids = vocab_ids
        self.walk = walk
        self.sampling = sampling
        self.reference = reference
        self.scorer = None if reference else ServingLatticeHead(head)
        self.reports_confidence = reports_confidence  # for draft_confidence_floor only
        self.name = f"lattice-{walk}" + ("-sampled" if sampling == "probabilistic" else "")

    @classmethod
    def from_resources(cls, options: LiliPropOptions, resources) -> "LatticeRule":
        return cls(load_lattice_head(resources), resources.vocab_size, options.walk,
                   options.sampling, reports_confidence=options.reports_confidence,
                   vocab_ids=resources.draft_vocab_ids)

    @torch.inference_mode()
    def lattice(self, inputs: DraftInputs) -> Lattice:
        b, s, h = inputs.hidden.shape
        k = self.head.config.candidate_topk
        logits = scored_logits(inputs, self.vocab_ids).view(b * s, -1)
        if self.reference and not logits.is_cuda:
            ids, log_probs = topk_candidates_reference(logits, k)
        else:
            ids, log_probs = topk_candidates(logits, k)
        if self.vocab_ids is not None:  # increasing ids: the tie order (lowest id first) holds
            ids = self.vocab_ids[ids]
        ids, log_probs = ids.view(b, s, k), log_probs.view(b, s, k)
        score = self.head.score if self.scorer is None else self.scorer.score
        start, pairs = score(
            inputs.embed(ids), log_probs, inputs.hidden, inputs.anchor_hidden, inputs.anchor_valid
        )
        start, pairs = with_logprob_prior(start, pairs, log_probs, self.head.config.prior_weight)
        return Lattice(ids, start, pairs, log_probs)

    def walk_faults(self, start: torch.Tensor, pairs: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return (walk_faults_reference if self.reference else walk_faults)(start, pairs, index)

    def draft_output(self, lattice: Lattice, index: torch.Tensor, faulty: torch.Tensor,
                     probs: torch.Tensor | None = None) -> DraftOutput:
        """The block of a walked lattice: each slot's chosen candidate, with the drafter's
        argmax (the top-1 candidates) as the faulty rows' fallback."""
        token_ids = lattice.candidate_ids.gather(-1, index.unsqueeze(-1)).squeeze(-1)
        confidence = None
        if self.reports_confidence:
            # The candidates' log-probs are the drafter's over its whole (candidate) vocabulary:
            # no logsumexp here.
            confidence = lattice.log_probs.gather(-1, index.unsqueeze(-1)).squeeze(-1).exp()
        return DraftOutput(token_ids, probs, faulty, lattice.top1_ids(), confidence)

    def walk_scores(self, inputs: DraftInputs, lattice: Lattice):
        """(start, pairs) the walk maximizes; the DeLS combination adds its terms here."""
        return lattice.start, lattice.pairs

    @torch.inference_mode()
    def propose(self, inputs: DraftInputs) -> DraftOutput:
        lattice = self.lattice(inputs)
        start, pairs = self.walk_scores(inputs, lattice)
        temperature = sampling_temperature(inputs, self.sampling)
        probs = None
        if temperature is not None:
            index, step_probs = sampled_walk(start, pairs, temperature)
            probs = torch.zeros(*index.shape, self.vocab_size, dtype=torch.float32,
                                device=index.device)
            probs.scatter_(-1, lattice.candidate_ids, step_probs)
        elif self.walk == "viterbi":
            index = viterbi_walk(start, pairs)
        else:
            index = greedy_walk(start, pairs)
        return self.draft_output(lattice, index, self.walk_faults(start, pairs, index), probs)
