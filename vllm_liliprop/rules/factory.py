"""Build the draft rule named by the options from what the proposer loaded."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from vllm_liliprop.faults import check_loaded_weights
from vllm_liliprop.options import LiliPropOptions, OptionError
from vllm_liliprop.rules.base import ArgmaxRule, DraftRule
from vllm_liliprop.rules.dels import DelsRule
from vllm_liliprop.rules.domino import DominoRule
from vllm_liliprop.rules.dspark import DSparkRule
from vllm_liliprop.rules.lattice import LatticeRule
from vllm_liliprop.rules.lattice_dels import LatticeDelsRule


@dataclass
class RuleResources:
    """What a rule may need, gathered by the proposer at load time."""

    draft_dir: Path | None
    vocab_size: int
    device: torch.device
    dtype: torch.dtype
    embed_weight: torch.Tensor | None = None  # target input embeddings [V, H]
    dflash_config: dict[str, Any] = field(default_factory=dict)
    block_size: int = 0
    num_slots: int = 0  # num_speculative_tokens
    draft_hidden_size: int = 0
    rms_norm_eps: float = 1e-6
    # LiLiCorr head weights (names as in upstream's checkpoint, without the `lilicorr.` prefix).
    lattice_state_dict: dict[str, torch.Tensor] | None = None
    tokenizer_fingerprint: str | None = None
    # Target ids [n] of a reduced draft vocabulary (draft_vocab_size + d2t), ascending; None
    # for a full-vocabulary draft. Rules that can run over it (DeLS) do less work per step.
    draft_vocab_ids: torch.Tensor | None = None
    # DSpark's Markov head weights (upstream names without the `markov_head.` prefix).
    markov_state_dict: dict[str, torch.Tensor] | None = None
    # The draft's config.json as vLLM read it (logit_scale, dspark_draft_topk, ...).
    draft_hf_config: dict[str, Any] = field(default_factory=dict)


def _load_custom_rule(spec: str):
    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise OptionError(
            f"rule = {spec!r}: cannot import {attr!r} from {module_name!r} ({exc}); "
            "give an importable 'package.module:factory'."
        ) from None
    return factory


def check_lattice_weights(resources: RuleResources) -> None:
    """The LiLiCorr head's checkpoint tensors, finite and floating-point (vLLM's loader has
    checked their names and shapes, not their values): a NaN head is refused at load rather
    than faulting on every row at run time."""
    if resources.lattice_state_dict is None:
        return
    where = resources.draft_dir if resources.draft_dir is not None else "the draft checkpoint"
    check_loaded_weights(
        {f"lilicorr.{name}": value for name, value in resources.lattice_state_dict.items()},
        f"{where} (*.safetensors)",
        "the LiLiCorr head diverged in training or the file is damaged: retrain or re-export "
        "the draft",
    )


# Each built-in rule's constructor from the options and what the proposer loaded.
RULES: dict[str, Callable[[LiliPropOptions, RuleResources], DraftRule]] = {
    "argmax": lambda options, resources: ArgmaxRule(resources.draft_vocab_ids,
                                                    options.reports_confidence),
    "lattice": LatticeRule.from_resources,
    "dels": DelsRule.from_resources,
    "lattice+dels": LatticeDelsRule.from_resources,
    "dspark": DSparkRule.from_resources,
    "domino": DominoRule.from_resources,
}


def build_rule(options: LiliPropOptions, resources: RuleResources) -> DraftRule:
    """The rule the options name: a built-in one (RULES) or a user's 'package.module:factory'."""
    if ":" in options.rule:
        return _load_custom_rule(options.rule)(options, resources)
    if options.rule not in RULES:
        raise OptionError(f"rule = {options.rule!r} is unknown; built-in rules: {', '.join(RULES)}, "
                          "or a 'package.module:factory'.")
    if options.uses_lattice:
        check_lattice_weights(resources)
    return RULES[options.rule](options, resources)
