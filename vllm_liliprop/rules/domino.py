"""Domino: the drafter's block logits corrected slot by slot by a recurrent head (heads/domino.py)
over the tokens drafted before each slot (heads/sequential.py)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from vllm_liliprop.heads.domino import DominoHead, load_domino_head
from vllm_liliprop.heads.sequential import argmax_pick, sampled_pick, sequential_draft
from vllm_liliprop.options import LiliPropOptions, OptionError
from vllm_liliprop.rules.base import DraftInputs, DraftOutput
from vllm_liliprop.rules.lattice import sampling_temperature


def domino_folder(options: LiliPropOptions, resources) -> Path:
    """options.domino_path, relative to the draft directory unless absolute."""
    path = Path(options.domino_path)
    if not path.is_absolute():
        if resources.draft_dir is None:
            raise OptionError(
                f"domino_path = {options.domino_path!r} is relative but the draft is not a local "
                "directory; give an absolute domino_path."
            )
        path = resources.draft_dir / path
    if not path.exists():
        raise OptionError(
            f"domino_path: no Domino head at {path}; export the draft with "
            "`training.export.export_domino` or point domino_path at a folder with config.json + "
            "model.safetensors."
        )
    return path


def load_domino(options: LiliPropOptions, resources) -> DominoHead:
    """The draft's Domino head in fp32 on the proposer's device, reading the target's table."""
    path = domino_folder(options, resources)
    if resources.embed_weight is None:
        raise ValueError("the Domino head reads the target's input embeddings, which this target "
                         "does not expose (model.embed_tokens); serve the draft without the rule")
    # vLLM may pad the table's rows; the head covers the vocabulary's.
    head = load_domino_head(path, resources.embed_weight[: resources.vocab_size],
                            device=resources.device)
    width = resources.draft_hidden_size
    if width and head.config.hidden_size != width:
        raise ValueError(f"{path}: Domino config.hidden_size = {head.config.hidden_size} but the "
                         f"drafter is {width} wide; use the head exported with this draft")
    return head


def scoring(head: DominoHead, ids: torch.Tensor) -> DominoHead:
    """`head` scoring the target ids `ids` (ascending): itself when they are its vocab_ids, else
    with its `up` rows for those ids (`restricted_to`; zero for ids it never scored)."""
    ids = ids.to(head.vocab_ids.device).long()
    if torch.equal(ids, head.vocab_ids):
        return head
    if not bool(torch.isin(ids, head.vocab_ids).any()):
        raise ValueError(f"the Domino head scores none of the draft's {ids.numel()} ids; it was "
                         "trained for another draft vocabulary: use the head exported with this draft")
    with torch.no_grad():
        weight = head.restricted_to(ids)
    head.up = nn.Linear(head.config.rank, ids.numel(), bias=False, device=weight.device,
                        dtype=weight.dtype).requires_grad_(False)
    head.up.weight.copy_(weight)
    head.vocab_ids = ids
    return head


class DominoRule:
    """Domino over the drafter's vocabulary. With `vocab_ids` (a draft with a reduced vocabulary,
    ascending target ids) the drafter's logits and the head's residual cover those ids only,
    and drafts and distributions are mapped back to target ids."""

    needs_anchor_hidden = False

    def __init__(self, head: DominoHead, vocab_size: int, sampling: str = "deterministic",
                 vocab_ids: torch.Tensor | None = None):
        self.vocab_size = vocab_size
        device = head.vocab_ids.device
        self.vocab_ids = None if vocab_ids is None else vocab_ids.to(device).long()
        scored = torch.arange(vocab_size, device=device) if self.vocab_ids is None else self.vocab_ids
        self.head = scoring(head, scored).eval()
        self.sampling = sampling
        self.name = "domino" + ("-sampled" if sampling == "probabilistic" else "")

    @classmethod
    def from_resources(cls, options: LiliPropOptions, resources) -> "DominoRule":
        return cls(load_domino(options, resources), resources.vocab_size, options.sampling,
                   resources.draft_vocab_ids)

    @torch.inference_mode()
    def propose(self, inputs: DraftInputs) -> DraftOutput:
        base = inputs.long_logits() if self.vocab_ids is None else inputs.draft_logits()
        temperature = sampling_temperature(inputs, self.sampling)
        probs, pick = None, argmax_pick
        if temperature is not None:
            probs = torch.empty_like(base)
            pick = sampled_pick(temperature, probs)
        ids, faulty = sequential_draft(base, inputs.anchor_ids, inputs.hidden, self.head, pick,
                                       self.vocab_ids)
        fallback = base.argmax(dim=-1)
        if self.vocab_ids is not None:
            ids, fallback, probs = self.vocab_ids[ids], self.vocab_ids[fallback], self._to_target(probs)
        return DraftOutput(ids, probs, faulty, fallback)

    def _to_target(self, probs: torch.Tensor | None) -> torch.Tensor | None:
        """[B, S, n] over the draft vocabulary -> [B, S, V] (zero outside it)."""
        if probs is None:
            return None
        full = probs.new_zeros(*probs.shape[:-1], self.vocab_size)
        return full.index_copy_(-1, self.vocab_ids, probs)
