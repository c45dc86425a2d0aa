"""Per-run metrics from one batch's counter delta, output tokens and wall time.

tau = 1 + accepted / drafts over the whole run (block-weighted: every verification counts once,
whatever its request); 1.0 with no drafts (AR). accept_per_pos[i] = fraction of drafts whose
token at position i + 1 was accepted. tokens_per_s = output tokens / generation wall time.
speedup = tokens_per_s / tokens_per_s of AR on the same setting in the same run; NaN without one.
"""

from __future__ import annotations

import math

from vllm_liliprop.vllm.metrics import SpecDecodeCounters


def run_metrics(counters: SpecDecodeCounters, output_tokens: int, wall_s: float) -> dict:
    return {
        "num_drafts": counters.num_drafts,
        "num_draft_tokens": counters.num_draft_tokens,
        "num_accepted_tokens": counters.num_accepted_tokens,
        "tau": counters.tau,
        "accept_per_pos": [round(r, 6) for r in counters.acceptance_rate_per_pos],
        "output_tokens": output_tokens,
        "wall_s": wall_s,
        "tokens_per_s": output_tokens / wall_s if wall_s > 0 else math.nan,
    }


def speedup(tokens_per_s: float, baseline_tokens_per_s: float | None) -> float:
    if baseline_tokens_per_s is None or not baseline_tokens_per_s > 0 or math.isnan(tokens_per_s):
        return math.nan
    return tokens_per_s / baseline_tokens_per_s
