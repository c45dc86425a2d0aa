"""What a draft rule sees and returns. Plain torch: rules never touch vLLM objects.

The proposer runs the DFlash drafter once per step, then hands a rule the drafter's final-normed
hidden states at the S mask slots of each request's block and a few callables, and the rule
returns one token per slot. Shapes: B requests, S draft slots, H draft width, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import torch

from vllm_liliprop.faults import non_finite_rows
from vllm_liliprop.options import OptionError


@dataclass
class DraftInputs:
    hidden: torch.Tensor  # [B, S, H] drafter hidden states at the mask slots
    anchor_ids: torch.Tensor  # [B] int64: the last verified token, first token of the block
    compute_logits: Callable[[torch.Tensor], torch.Tensor]  # [N, H] -> [N, V] full vocabulary
    embed: Callable[[torch.Tensor], torch.Tensor]  # target input embeddings of token ids
    # Target state at the last verified position that has one (hidden_norm(fc(taps))), [B, H],
    # and whether it exists (a request's first draft after a full rejection may have none).
    anchor_hidden: torch.Tensor | None = None
    anchor_valid: torch.Tensor | None = None
    # Per-request temperature [B] when some request samples, None when the batch is all greedy.
    temperature: torch.Tensor | None = None
    # A draft with a reduced vocabulary (draft_vocab_size + d2t): [N, H] -> [N, n] logits over
    # its n draft ids, before vLLM scatters them into V; None for a full-vocabulary draft.
    draft_vocab_logits: Callable[[torch.Tensor], torch.Tensor] | None = None

    @property
    def batch_size(self) -> int:
        return self.hidden.shape[0]

    @property
    def num_slots(self) -> int:
        return self.hidden.shape[1]

    def long_logits(self) -> torch.Tensor:
        """The drafter's own full-vocabulary logits, [B, S, V] fp32."""
        b, s, h = self.hidden.shape
        return self.compute_logits(self.hidden.reshape(b * s, h)).float().view(b, s, -1)

    def draft_logits(self) -> torch.Tensor:
        """The drafter's logits over its reduced draft vocabulary, [B, S, n] fp32."""
        if self.draft_vocab_logits is None:
            raise ValueError("draft_logits() needs a draft with a reduced vocabulary")
        b, s, h = self.hidden.shape
        return self.draft_vocab_logits(self.hidden.reshape(b * s, h)).float().view(b, s, -1)


@dataclass
class DraftOutput:
    token_ids: torch.Tensor  # [B, S] int64
    # [B, S, V] fp32 distributions the drafts were sampled from, or None for deterministic drafts.
    probs: torch.Tensor | None = None
    # [B] bool: rows whose scores were unusable (`faults.non_finite_rows`: NaN or +inf in a score,
    # or a drafted token that scored -inf or NaN); the proposer replaces them with the drafter's
    # argmax. None means the rule never flags rows. The replacement happens on the device
    # whether or not a row is flagged (see rules/fallback.py), so this costs no host sync.
    faulty_rows: torch.Tensor | None = None
    # [B, S] int64: the drafter's argmax, when the rule already has it (its top-1 candidates);
    # saves the proposer recomputing it for the faulty-row replacement.
    fallback_ids: torch.Tensor | None = None
    # [B, S] fp32: the drafter's probability of each drafted token (whichever token the rule
    # drafted), from rules built for `draft_confidence_floor` (every built-in rule can be); None
    # otherwise. The proposer's confidence cut (draft_length.confident_cut) reads it.
    confidence: torch.Tensor | None = None


class DraftRule(Protocol):
    name: str

    def propose(self, inputs: DraftInputs) -> DraftOutput: ...


def argmax_drafts(inputs: DraftInputs) -> torch.Tensor:
    """vLLM's own DFlash draft: each slot's argmax, [B, S]."""
    b, s, h = inputs.hidden.shape
    return inputs.compute_logits(inputs.hidden.reshape(b * s, h)).argmax(-1).view(b, s)


class ArgmaxRule:
    """No head: exactly the drafter's argmax (used when only walk/sampling options are set).

    Over a reduced draft vocabulary it takes the argmax there, in fp32, as the proposer's own
    greedy path does (vllm/draft_greedy.py): the same tokens without scattering every slot's
    logits into the full vocabulary. Its fallback is itself, so flagging rows changes no draft;
    it makes a drafter that yields NaN/+inf show up in the proposer's fault count like any head
    would."""

    name = "argmax"

    def __init__(self, vocab_ids: torch.Tensor | None = None, reports_confidence: bool = False):
        self.vocab_ids = vocab_ids  # ascending target ids of the draft vocabulary, or None
        # Only where `draft_confidence_floor` reads it: a logsumexp over every slot's logits.
        self.reports_confidence = reports_confidence

    def propose(self, inputs: DraftInputs) -> DraftOutput:
        logits = scored_logits(inputs, self.vocab_ids)
        ids = logits.argmax(-1)
        faulty = non_finite_rows(logits, chosen=logits.gather(-1, ids.unsqueeze(-1)))
        confidence = drafted_probability(logits, ids) if self.reports_confidence else None
        if self.vocab_ids is not None:
            ids = self.vocab_ids[ids]
        return DraftOutput(ids, faulty_rows=faulty, fallback_ids=ids, confidence=confidence)


def drafted_probability(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The drafter's softmax probability [B, S] of each drafted token `ids` [B, S] under its
    logits [B, S, n] (ids index the same vocabulary as the logits). On SmolLM2's round-3 drafter
    it is calibrated: drafts at p 0.2-0.4 were the target's token 38-40% of the time."""
    chosen = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return (chosen - torch.logsumexp(logits, dim=-1)).exp()


def scored_logits(inputs: DraftInputs, vocab_ids: torch.Tensor | None) -> torch.Tensor:
    """The drafter's logits a rule scores: over its reduced draft vocabulary when it has one
    (`vocab_ids`, ascending target ids), else over the full vocabulary; [B, S, n] fp32."""
    return inputs.long_logits() if vocab_ids is None else inputs.draft_logits()


def to_target_ids(output: DraftOutput, vocab_ids: torch.Tensor | None, vocab_size: int) -> DraftOutput:
    """A rule's output over a reduced draft vocabulary in target ids: drafts and fallback ids
    mapped through `vocab_ids`, distributions [B, S, n] spread to [B, S, V] (zero outside it)."""
    if vocab_ids is None:
        return output
    probs = output.probs
    if probs is not None:
        probs = probs.new_zeros(*probs.shape[:-1], vocab_size).index_copy_(-1, vocab_ids, probs)
    fallback = None if output.fallback_ids is None else vocab_ids[output.fallback_ids]
    return DraftOutput(vocab_ids[output.token_ids], probs, output.faulty_rows, fallback, output.confidence)


def head_folder(option: str, value: str, resources, what: str, fix: str) -> Path:
    """A head folder option (`dels_path`, `domino_path`): relative to the draft directory unless
    absolute, and existing; OptionError naming the option and `fix` otherwise."""
    path = Path(value)
    if not path.is_absolute():
        if resources.draft_dir is None:
            raise OptionError(
                f"{option} = {value!r} is relative but the draft is not a local directory; give "
                f"an absolute {option}."
            )
        path = resources.draft_dir / path
    if not path.exists():
        raise OptionError(f"{option}: no {what} at {path}; {fix}")
    return path
