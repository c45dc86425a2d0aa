"""Speculative-decoding counters of one engine, tallied from its own per-step scheduler stats.

Why not `LLM.get_metrics()`: it reads Prometheus's process-wide registry, and each new engine's
Prometheus logger unregisters the earlier engine's metrics, so with several engines open in one
process only the one built last is counted. eval's side-by-side runs keep every system's engine
open at once (eval/side_by_side.py); each engine needs counters of its own.

The tally is one more stat logger in the engine's own `StatLoggerManager` (a list vLLM builds
from logger factories; `vllm.LLM` takes none, so it is appended after the engine starts). It sees
every step's `SchedulerStats.spec_decoding_stats` in the front-end process, in-process and
multiprocess engines alike, the same stats vLLM's Prometheus logger counts.
"""

from __future__ import annotations

from vllm.v1.metrics.loggers import AggregateStatLoggerBase

from vllm_liliprop.vllm.metrics import SpecDecodeCounters


class SpecDecodeTally(AggregateStatLoggerBase):
    """Running sums of the spec-decode stats the engine's scheduler reports each step."""

    def __init__(self, vllm_config=None, engine_indexes=None):
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        self.accepted_per_pos: list[int] = []

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
        stats = getattr(scheduler_stats, "spec_decoding_stats", None)
        if stats is None:
            return
        self.num_drafts += stats.num_drafts
        self.num_draft_tokens += stats.num_draft_tokens
        self.num_accepted_tokens += stats.num_accepted_tokens
        per_pos = list(stats.num_accepted_tokens_per_pos)
        if len(per_pos) > len(self.accepted_per_pos):
            self.accepted_per_pos += [0] * (len(per_pos) - len(self.accepted_per_pos))
        for pos, accepted in enumerate(per_pos):
            self.accepted_per_pos[pos] += accepted

    def log_engine_initialized(self) -> None:
        pass

    def counters(self) -> SpecDecodeCounters:
        return SpecDecodeCounters(self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens,
                                  tuple(self.accepted_per_pos))


def attach_tally(llm) -> SpecDecodeTally:
    """A tally of `llm`'s own steps from now on (needs `disable_log_stats=False`)."""
    manager = getattr(llm.llm_engine, "logger_manager", None)
    if manager is None:
        raise RuntimeError("the engine keeps no stats: start it with disable_log_stats=False")
    tally = SpecDecodeTally()
    manager.stat_loggers.append(tally)
    return tally
