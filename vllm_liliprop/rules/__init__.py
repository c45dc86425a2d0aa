"""Draft rules: how a block of drafter outputs becomes draft tokens (plain torch)."""

from vllm_liliprop.rules.base import (
    ArgmaxRule,
    DraftInputs,
    DraftOutput,
    DraftRule,
    argmax_drafts,
)

__all__ = [
    "ArgmaxRule",
    "DraftInputs",
    "DraftOutput",
    "DraftRule",
    "argmax_drafts",
]
