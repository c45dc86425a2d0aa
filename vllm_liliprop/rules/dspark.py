"""DSpark: the drafter's block logits plus the checkpoint's Markov transition bias, committed
left to right (upstream `Qwen3DSparkModel`, whose V2 speculator does the same).

Slot s scores draft id v as  base_s(v) + logit_scale * markov_w2[v] . markov_w1[prev_s],  prev_s
the anchor for slot 0 and the token drafted at slot s-1 after that (target ids). With
`dspark_draft_topk` = k only the k best base candidates of each slot keep a score (the others
-inf), as upstream's top-k variant. Drafts are each slot's best score, or, with sampling
"probabilistic" and a request at T > 0, draws from softmax(scores / T) whose distributions go to
the rejection sampler. A reduced draft vocabulary (draft_vocab_size + d2t) is scored over its
own ids and mapped back to target ids, as in rules/dels.py.
"""

from __future__ import annotations

import torch

from vllm_liliprop.faults import check_loaded_weights
from vllm_liliprop.heads.dspark import MARKOV_PREFIX, MarkovBiasHead
from vllm_liliprop.options import LiliPropOptions, OptionError
from vllm_liliprop.rules.sequential import SequentialHeadRule


def _where(resources) -> str:
    where = resources.draft_dir if resources.draft_dir is not None else "the draft checkpoint"
    return f"{where} (*.safetensors)"


def load_markov_head(resources) -> MarkovBiasHead:
    """The checkpoint's Markov head (fp32, on the proposer's device), its shapes checked against
    the draft's vocabularies and its values finite."""
    tensors = resources.markov_state_dict
    if not tensors:
        raise OptionError(
            f"rule 'dspark': {_where(resources)} has no Markov head tensors "
            f"({MARKOV_PREFIX}markov_w1.weight, {MARKOV_PREFIX}markov_w2.weight); a "
            "Qwen3DSparkModel checkpoint must ship them (export one with training.export."
            "export_dspark)."
        )
    check_loaded_weights(
        {MARKOV_PREFIX + name: value for name, value in tensors.items()}, _where(resources),
        "the Markov head diverged in training or the file is damaged: retrain or re-export "
        "the draft",
    )
    config = resources.draft_hf_config or {}
    scale = config.get("logit_scale")
    scale = 1.0 if scale is None else float(scale)
    try:
        head = MarkovBiasHead.from_state_dict(
            {name: value.float() for name, value in tensors.items()}, scale
        )
    except ValueError as exc:
        raise OptionError(f"rule 'dspark': {_where(resources)}: {exc}") from None
    ids = resources.draft_vocab_ids
    rows = resources.vocab_size if ids is None else int(ids.numel())
    w1, w2 = head.markov_w1.weight, head.markov_w2.weight
    if w1.shape[0] != resources.vocab_size or w2.shape[0] != rows:
        raise OptionError(
            f"rule 'dspark': {_where(resources)}: {MARKOV_PREFIX}markov_w1.weight "
            f"{tuple(w1.shape)} and markov_w2.weight {tuple(w2.shape)} need "
            f"{resources.vocab_size} rows (vocab_size) "
            f"and {rows} rows (the draft vocabulary: draft_vocab_size, d2t with increasing "
            "target ids); the head was trained for another vocabulary."
        )
    return head.to(resources.device).eval()


def read_topk(resources) -> int | None:
    """`dspark_draft_topk` of the draft config (vLLM copies speculative_config's override there)."""
    topk = (resources.draft_hf_config or {}).get("dspark_draft_topk")
    if topk is None:
        return None
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise OptionError(f"dspark_draft_topk = {topk!r} must be a positive integer or null.")
    return topk


class DSparkRule(SequentialHeadRule):
    def __init__(self, head: MarkovBiasHead, vocab_size: int, topk: int | None = None,
                 sampling: str = "deterministic", vocab_ids: torch.Tensor | None = None,
                 reports_confidence: bool = False):
        device = head.markov_w1.weight.device
        rows = head.markov_w2.weight.shape[0]
        self.topk = None if topk is None else min(int(topk), rows)
        super().__init__("dspark" + ("" if topk is None else f"-top{self.topk}"), head, vocab_size,
                         sampling, None if vocab_ids is None else vocab_ids.to(device).long(),
                         reports_confidence)

    @classmethod
    def from_resources(cls, options: LiliPropOptions, resources) -> "DSparkRule":
        return cls(load_markov_head(resources), resources.vocab_size, read_topk(resources),
                   options.sampling, resources.draft_vocab_ids,
                   options.reports_confidence)

    def candidate_mask(self, base: torch.Tensor) -> torch.Tensor | None:
        """[B, S, n] bool: each slot's top-k base candidates (None without top-k)."""
        if self.topk is None:
            return None
        index = base.topk(self.topk, dim=-1).indices
        return torch.zeros_like(base, dtype=torch.bool).scatter_(-1, index, True)
