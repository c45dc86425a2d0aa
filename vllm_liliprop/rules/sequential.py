"""Rules whose head corrects the drafter's block slot by slot from the tokens drafted before
each slot (DSpark's Markov head, Domino's recurrent head): heads/sequential.py does the drafting;
this class adds what every such rule shares: the scored vocabulary, the sampled contract, the
fallback and the mapping back to target ids."""

from __future__ import annotations

import torch

from vllm_liliprop.heads.sequential import argmax_pick, sampled_pick, sequential_draft
from vllm_liliprop.rules.base import DraftInputs, DraftOutput, drafted_probability, scored_logits, to_target_ids
from vllm_liliprop.rules.lattice import sampling_temperature


class SequentialHeadRule:
    """Drafts left to right with `head` over the drafter's vocabulary. With `vocab_ids` (a draft
    with a reduced vocabulary, ascending target ids) the logits and the head's residual cover
    those ids only, and drafts and distributions are mapped back to target ids."""

    needs_anchor_hidden = False

    def __init__(self, name: str, head, vocab_size: int, sampling: str = "deterministic",
                 vocab_ids: torch.Tensor | None = None, reports_confidence: bool = False):
        self.head, self.vocab_size, self.sampling = head, vocab_size, sampling
        self.vocab_ids = vocab_ids
        self.reports_confidence = reports_confidence  # for draft_confidence_floor only
        self.name = name + ("-sampled" if sampling == "probabilistic" else "")

    def candidate_mask(self, base: torch.Tensor) -> torch.Tensor | None:
        """[B, S, n] bool of the ids each slot may draft; None: every id."""
        return None

    @torch.inference_mode()
    def propose(self, inputs: DraftInputs) -> DraftOutput:
        base = scored_logits(inputs, self.vocab_ids)
        temperature = sampling_temperature(inputs, self.sampling)
        probs, pick = None, argmax_pick
        if temperature is not None:
            probs = torch.zeros_like(base)
            pick = sampled_pick(temperature, probs)
        ids, faulty = sequential_draft(base, inputs.anchor_ids, inputs.hidden, self.head, pick,
                                       self.vocab_ids, self.candidate_mask(base))
        # The drafter's logits are at hand: their argmax saves the fallback a second projection.
        # The drafter's probability of the corrected draft, as the DeLS rule reports it: the
        # measured-calibrated quantity (docs/measurements-smollm2.md, "The confidence cut").
        confidence = drafted_probability(base, ids) if self.reports_confidence else None
        output = DraftOutput(ids, probs, faulty, base.argmax(dim=-1), confidence)
        return to_target_ids(output, self.vocab_ids, self.vocab_size)
