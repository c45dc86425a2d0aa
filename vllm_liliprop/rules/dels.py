"""DeLS-Spec: the drafter's logits fused with a short-context head, slot by slot."""

from __future__ import annotations

import torch

from vllm_liliprop.heads.dels import SubVocabShortHead, slot_weights
from vllm_liliprop.heads.dels_io import load_dels_head
from vllm_liliprop.rules.dels_draft import dels_draft, dels_draft_sampled
from vllm_liliprop.options import LiliPropOptions, OptionError
from vllm_liliprop.rules.base import (DraftInputs, DraftOutput, drafted_probability, head_folder, scored_logits,
                                     to_target_ids)
from vllm_liliprop.rules.lattice import sampling_temperature


def load_dels(options: LiliPropOptions, resources):
    """(head, log_prior, alpha[S], beta[S], pure_draft_prefix_len) for this draft."""
    path = head_folder("dels_path", options.dels_path, resources, "DeLS head",
                       "export one with `python -m training.export` or point dels_path at a "
                       "folder with config.json + model.safetensors.")
    head, prior, config = load_dels_head(
        path, resources.embed_weight, resources.vocab_size, resources.tokenizer_fingerprint,
        device=resources.device,
    )
    weights = {}
    for name in ("alpha", "beta"):
        override = getattr(options, f"dels_{name}")
        if override is None:  # the head's own weights
            weights[name] = config.slot_weights(name, resources.num_slots)
            continue
        try:
            weights[name] = slot_weights(override, resources.num_slots, f"dels_{name}", "the draft")
        except ValueError as exc:
            raise OptionError(f"{exc}.") from None
    return head.eval(), prior.log_probs, weights["alpha"], weights["beta"], config.pure_draft_prefix_len


def device_schedule(weights, log_prior: torch.Tensor) -> torch.Tensor:
    """Per-slot weights as fp32 [S] on the prior's device, built once at load: a Python list
    turned into a device tensor on every draft step would be a pageable host-to-device copy,
    which waits for the device."""
    return torch.as_tensor(weights, dtype=torch.float32).reshape(-1).to(log_prior.device)


class DelsRule:
    """DeLS over the drafter's vocabulary. With `vocab_ids` (a draft with a reduced vocabulary,
    ascending target ids) everything runs over those ids only (`dels.SubVocabShortHead`: the
    same drafts, a third of the work for SmolLM2's 16,384 of 49,152) and the drafts and
    distributions are mapped back to target ids."""

    needs_anchor_hidden = False

    def __init__(self, head, log_prior, alpha, beta, pure_draft_prefix_len=0,
                 sampling="deterministic", vocab_ids: torch.Tensor | None = None,
                 reports_confidence: bool = False):
        self.vocab_size = int(log_prior.numel())
        self.vocab_ids = None if vocab_ids is None else vocab_ids.to(log_prior.device).long()
        if self.vocab_ids is not None:
            head, log_prior = SubVocabShortHead(head, self.vocab_ids), log_prior[self.vocab_ids]
        self.head, self.log_prior = head, log_prior
        self.alpha = device_schedule(alpha, log_prior)
        self.beta = device_schedule(beta, log_prior)
        self.pure_draft_prefix_len = pure_draft_prefix_len
        self.sampling = sampling
        self.reports_confidence = reports_confidence  # for draft_confidence_floor only
        self.name = "dels" + ("-sampled" if sampling == "probabilistic" else "")

    @classmethod
    def from_resources(cls, options: LiliPropOptions, resources) -> "DelsRule":
        head, log_prior, alpha, beta, prefix = load_dels(options, resources)
        return cls(head, log_prior, alpha, beta, prefix, options.sampling,
                   resources.draft_vocab_ids, options.reports_confidence)

    @torch.inference_mode()
    def propose(self, inputs: DraftInputs) -> DraftOutput:
        long_logits = scored_logits(inputs, self.vocab_ids)
        s = long_logits.shape[1]
        alpha, beta = self.alpha[:s], self.beta[:s]
        temperature = sampling_temperature(inputs, self.sampling)
        probs = None
        if temperature is not None:
            ids, probs, faulty = dels_draft_sampled(
                long_logits, inputs.anchor_ids, self.head, self.log_prior, alpha, beta,
                temperature, pure_draft_prefix_len=self.pure_draft_prefix_len, return_faulty=True,
                vocab_ids=self.vocab_ids,
            )
        else:
            ids, faulty = dels_draft(
                long_logits, inputs.anchor_ids, self.head, self.log_prior, alpha, beta,
                pure_draft_prefix_len=self.pure_draft_prefix_len, return_faulty=True,
                vocab_ids=self.vocab_ids,
            )
        # The long logits are at hand: their argmax saves the fallback a second projection.
        confidence = drafted_probability(long_logits, ids) if self.reports_confidence else None
        output = DraftOutput(ids, probs, faulty, long_logits.argmax(dim=-1), confidence)
        return to_target_ids(output, self.vocab_ids, self.vocab_size)
