"""The drafter's log-probs as a prior on a LiLiCorr walk's scores (a liliprop extension).

Upstream's walk ranks candidates by the head's scaled cosines alone, so the head has to rebuild
the drafter's own ranking inside a bounded cosine before it can correct it. With a prior the
walk maximizes

    start[b, j]       + w * log p[b, 0, j]
    pairs[b, s, i, j] + w * log p[b, s + 1, j]

so a head that scores every pair alike walks the drafter's argmax, and what it learns is the
correction. `w` is `dflash_config.liliprop_lattice_prior_weight` (absent or 0: upstream's walk,
bit for bit); upstream vLLM ignores the key and walks without the prior.
"""

from __future__ import annotations

import torch

PRIOR_KEY = "liliprop_lattice_prior_weight"


def with_logprob_prior(start: torch.Tensor, pairs: torch.Tensor, log_probs: torch.Tensor,
                       weight: float | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(start, pairs) plus `weight` times each candidate's drafter log-prob [B, S, K]; a weight
    of 0 (a plain number) returns them untouched: upstream's walk, bit for bit."""
    if not isinstance(weight, torch.Tensor) and weight == 0:
        return start, pairs
    prior = weight * log_probs.to(start.dtype)
    return start + prior[:, 0], pairs + prior[:, 1:pairs.shape[1] + 1, None, :]
