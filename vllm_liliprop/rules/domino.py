"""Domino: the drafter's block logits corrected slot by slot by a recurrent head (heads/domino.py)
over the tokens drafted before each slot (heads/sequential.py)."""

from __future__ import annotations

import torch
from torch import nn

from vllm_liliprop.heads.domino import DominoHead, load_domino_head
from vllm_liliprop.options import LiliPropOptions, OptionError
from vllm_liliprop.rules.base import head_folder
from vllm_liliprop.rules.sequential import SequentialHeadRule


def load_domino(options: LiliPropOptions, resources) -> DominoHead:
    """The draft's Domino head in fp32 on the proposer's device, reading the target's table."""
    path = head_folder("domino_path", options.domino_path, resources, "Domino head",
                       "export the draft with `training.export.export_domino` or point "
                       "domino_path at a folder with config.json + model.safetensors.")
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


class DominoRule(SequentialHeadRule):
    def __init__(self, head: DominoHead, vocab_size: int, sampling: str = "deterministic",
                 vocab_ids: torch.Tensor | None = None, reports_confidence: bool = False):
        device = head.vocab_ids.device
        vocab_ids = None if vocab_ids is None else vocab_ids.to(device).long()
        scored = torch.arange(vocab_size, device=device) if vocab_ids is None else vocab_ids
        super().__init__("domino", scoring(head, scored).eval(), vocab_size, sampling, vocab_ids,
                         reports_confidence)

    @classmethod
    def from_resources(cls, options: LiliPropOptions, resources) -> "DominoRule":
        return cls(load_domino(options, resources), resources.vocab_size, options.sampling,
                   resources.draft_vocab_ids, options.reports_confidence)
