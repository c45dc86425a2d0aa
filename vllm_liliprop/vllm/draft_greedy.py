"""vLLM's greedy DFlash draft (each slot's argmax), computed where it is cheap on a CPU.

vLLM's `_greedy_sample` takes `compute_logits(h).argmax(-1)`. With a reduced draft vocabulary
(`draft_vocab_size` + `d2t`), `compute_logits` first scatters the N draft logits into a
full-vocabulary tensor of -inf; the argmax then scans all V entries, in bf16, where PyTorch's
CPU argmax is about twice as slow as in fp32 (measured: 0.95 vs 0.45 ms for [7, 49152]). Here
the argmax runs over the N draft logits in fp32 (every bf16 value is exact in fp32, so the
maximum is the same; `cpu_argmax.row_argmax`, vLLM's own CPU argmax op) and maps the winner to
its target id.

Ties: argmax returns the first maximum. When d2t maps draft ids to strictly increasing target
ids (the convention, and what training/export.py writes), the first maximum in draft order is
the first in target order, so the tokens are vLLM's; for any other mapping this path is not used.
The one difference: a row whose draft logits are all -inf gets target id ids[0] here and 0 in
vLLM (both are arbitrary, and verification rejects either).
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

from vllm_liliprop.vllm.cpu_argmax import row_argmax


def draft_vocab_ids(model) -> torch.Tensor | None:
    """The target ids [n] of a DFlash draft's reduced vocabulary, strictly increasing; None for
    a full-vocabulary draft or a mapping that is not increasing (then every path keeps vLLM's
    full-vocabulary logits)."""
    offsets = getattr(model, "draft_id_to_target_id", None)
    if offsets is None:
        return None
    offsets = offsets.detach().to(torch.int64)
    targets = torch.arange(offsets.numel(), device=offsets.device) + offsets
    if offsets.numel() > 1 and not bool((targets[1:] > targets[:-1]).all()):
        return None
    return targets


def draft_vocab_logits(model):
    """[N, H] -> [N, n]: the draft's logits over its own vocabulary (before vLLM scatters them)."""
    return lambda hidden_states: model.logits_processor(model.lm_head, hidden_states)


class DraftVocabArgmax:
    def __init__(self, logits, target_ids: torch.Tensor | None):
        self.logits = logits
        self.target_ids = target_ids  # of each draft id, None for a full vocabulary

    @classmethod
    def for_model(cls, model, vllm_paths: bool) -> "DraftVocabArgmax | None":
        """The fast path for a DFlash draft model, or None where vLLM's own must run: its local
        argmax reduction or heterogeneous-vocabulary paths, a model without the standard
        LM head / logits processor, or a mapping that is not increasing."""
        if vllm_paths or getattr(model, "lm_head", None) is None:
            return None
        if getattr(model, "logits_processor", None) is None:
            return None
        target_ids = draft_vocab_ids(model)
        if target_ids is None and getattr(model, "draft_id_to_target_id", None) is not None:
            return None
        return cls(draft_vocab_logits(model), target_ids)

    def __call__(self, hidden_states: torch.Tensor) -> torch.Tensor:
        ids = row_argmax(self.logits(hidden_states))
        return ids if self.target_ids is None else self.target_ids[ids]




def candidate_vocab_logits(model, target_ids: torch.Tensor):
    """[N, H] -> [N, n]: the draft's logits at `target_ids` only (a LiLiCorr draft's candidate
    vocabulary, heads/candidate_vocab.py), equal to those columns of `compute_logits`. A layer
    holding a copy of the LM head's rows of those ids ([n, H], so a step reads n rows instead of
    V) goes through the head's own unquantized method, which on a CPU prepacks it for vLLM's
    GEMM (oneDNN; torch's F.linear ran these rows 2x slower than vLLM's full head), and through
    the draft's logits processor (soft cap, scale; the stage rows time it as the LM head)."""
    head, processor = getattr(model, "lm_head", None), getattr(model, "logits_processor", None)
    method = getattr(head, "quant_method", None)
    fix = "delete the draft's candidate_vocab/ folder to serve the full-vocabulary lattice"
    if processor is None or not isinstance(method, UnquantizedEmbeddingMethod) or head.weight.dim() != 2:
        raise ValueError(f"candidate_vocab/ needs a plain (unquantized) LM head and vLLM's logits "
                         f"processor on the draft; {fix}")
    if processor.logits_as_input or getattr(head, "bias", None) is not None:
        raise ValueError(f"candidate_vocab/ does not support an LM head with a bias or logits as "
                         f"input; {fix}")
    rows = torch.nn.Module()
    rows.weight = torch.nn.Parameter(head.weight.detach()[target_ids.to(head.weight.device)].contiguous(),
                                     requires_grad=False)
    rows.tp_size, rows.quant_method = 1, method
    method.process_weights_after_loading(rows)
    return lambda hidden_states: processor(rows, hidden_states)
