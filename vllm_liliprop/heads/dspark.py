"""DSpark's sequential stage (upstream `DSparkMarkovHead`, vLLM 0.32 qwen3_dspark.py) in plain
torch: a low-rank transition bias added to the drafter's logits,

    residual_s(v) = scale * markov_w2[v] . markov_w1[prev_s]

markov_w1 [V, r] embeds the previous token (target ids), markov_w2 [n, r] projects to the draft
vocabulary (n = draft_vocab_size, V for a full-vocabulary draft); scale is the draft's
logit_scale, which upstream's logits processor applies to the bias as to the base logits. The
parameter names are upstream's under `markov_head.` (`MARKOV_PREFIX`), so a checkpoint's tensors
load as they are. Sequential-head protocol: heads/sequential.py.
"""

from __future__ import annotations

import torch
from torch import nn

MARKOV_PREFIX = "markov_head."


class MarkovBiasHead(nn.Module):
    def __init__(self, vocab_size: int, draft_vocab_size: int, rank: int, scale: float = 1.0,
                 *, device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        if min(vocab_size, draft_vocab_size, rank) <= 0:
            raise ValueError(f"vocab_size, draft_vocab_size and markov_rank must be positive, got "
                             f"{vocab_size}, {draft_vocab_size}, {rank}")
        factory = {"device": device, "dtype": dtype}
        self.markov_w1 = nn.Embedding(vocab_size, rank, **factory)
        self.markov_w2 = nn.Linear(rank, draft_vocab_size, bias=False, **factory)
        # Starts as "no correction": a head trained on a finished drafter begins at its loss.
        nn.init.zeros_(self.markov_w2.weight)
        self.scale = float(scale)

    @classmethod
    def from_state_dict(cls, tensors: dict[str, torch.Tensor], scale: float = 1.0) -> "MarkovBiasHead":
        """From upstream-named tensors (`markov_w1.weight`, `markov_w2.weight`, prefix removed)."""
        missing = {"markov_w1.weight", "markov_w2.weight"} - set(tensors)
        if missing:
            raise ValueError(f"DSpark Markov head is missing {sorted(missing)} (expected under "
                             f"{MARKOV_PREFIX!r} in the draft's safetensors)")
        w1, w2 = tensors["markov_w1.weight"], tensors["markov_w2.weight"]
        if w1.dim() != 2 or w2.dim() != 2 or w1.shape[1] != w2.shape[1]:
            raise ValueError(f"DSpark Markov head shapes markov_w1 {tuple(w1.shape)}, markov_w2 "
                             f"{tuple(w2.shape)}: expected [V, r] and [n, r]")
        head = cls(w1.shape[0], w2.shape[0], w1.shape[1], scale, device=w1.device, dtype=w1.dtype)
        head.load_state_dict({"markov_w1.weight": w1, "markov_w2.weight": w2})
        return head

    def init_state(self, batch: int, device=None) -> None:
        return None

    def step(self, state, prev_ids: torch.Tensor, hidden: torch.Tensor):
        return self.scale * self.markov_w2(self.markov_w1(prev_ids)), state

    def teacher_forced(self, prev_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return self.scale * self.markov_w2(self.markov_w1(prev_ids))
