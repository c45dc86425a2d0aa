"""A draft rule's health in vLLM's own metrics: per rule, draft rows, fallback rows and faults.

A head can saturate while serving (finite but useless scores) or fault (non-finite scores, an
exception): its rows then fall back to the drafter's argmax, output stays lossless, and only
these counters tell the operator. They travel the way vLLM's own spec-decode counters do:

1. each `LiliPropProposer` with a rule registers here (`register_source`); it counts the rows
   it drafted, the rows that fell back and its faults (`LiliPropProposer.rule_health`);
2. the scheduler's `make_stats` (patched) drains the counts since its last call into the step's
   `SpecDecodingStats`, as a `RuleSpecDecodingStats` (one more field, `rule_health`, which the
   patched `SchedulerStats` annotation lets vLLM's msgpack decoder keep);
3. in the frontend, `SpecDecodingProm.observe` (patched) adds them to three Prometheus counters
   registered beside vLLM's (`vllm:liliprop_rule_*_total`, labels model_name, engine, rule), so
   they appear in the OpenAI server's `/metrics` and in `LLM.get_metrics()`; a rule whose
   fallback share passes `HIGH_FALLBACK_SHARE` is logged there once.

Steps 1-2 share the engine-core process: true for the in-process engine and for the engine-core
process of a multiprocess one with the uniproc executor (one device, CPU included). With one
worker process per device (tensor parallel) the proposers live elsewhere and nothing is exported.
"""

from __future__ import annotations

import weakref
from dataclasses import asdict, dataclass, field

import prometheus_client
from vllm.logger import init_logger
from vllm.v1.spec_decode.metrics import SpecDecodingStats

logger = init_logger("vllm.liliprop.rule_health")

# (name, help) of the exported counters, in the order of a source's counts.
COUNTERS = (
    ("vllm:liliprop_rule_draft_rows", "Requests drafted by a vllm-liliprop draft rule (one per draft step)."),
    ("vllm:liliprop_rule_fallback_rows", "Draft rows that fell back to the drafter's argmax."),
    ("vllm:liliprop_rule_faults", "Draft steps in which the rule faulted (raised or scored non-finite)."),
)
HIGH_FALLBACK_SHARE = 0.2  # warn once a rule's fallback rows pass this share of its draft rows...
MIN_ROWS_TO_WARN = 64  # ...after this many draft rows

# Live proposers -> their counts at the last drain. Keyed weakly, not by id(): an engine's
# proposer freed and a new one allocated at the same address would otherwise inherit the old
# counts and drain a negative delta, which Prometheus refuses by raising inside the engine.
_last: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def register_source(proposer) -> None:
    """A proposer whose `rule_health()` -> (rule, draft_rows, fallback_rows, faults), cumulative."""
    _last[proposer] = (0, 0, 0)


def drain() -> dict[str, list[int]]:
    """rule -> [draft_rows, fallback_rows, faults] since the last drain, over live sources."""
    out: dict[str, list[int]] = {}
    for source, before in list(_last.items()):
        rule, *counts = source.rule_health()
        _last[source] = tuple(counts)
        delta = [now - then for now, then in zip(counts, before)]
        if any(delta):
            out[rule] = [a + b for a, b in zip(out.get(rule, [0, 0, 0]), delta)]
    return out


@dataclass
class RuleSpecDecodingStats(SpecDecodingStats):
    rule_health: dict[str, list[int]] = field(default_factory=dict)


def with_rule_health(stats: SpecDecodingStats | None, num_spec_tokens: int) -> SpecDecodingStats | None:
    """The step's spec-decode stats carrying the rule counts drained now (unchanged if none)."""
    health = drain()
    if not health:
        return stats
    if stats is None:
        stats = RuleSpecDecodingStats.new(num_spec_tokens)
    elif not isinstance(stats, RuleSpecDecodingStats):
        stats = RuleSpecDecodingStats(**asdict(stats))
    stats.rule_health = health
    return stats


class RuleHealthProm:
    """The three counters, per engine and rule, and the one-time warning on a high fallback share."""

    def __init__(self, labelnames: list[str], per_engine_labelvalues: dict[int, list[object]]):
        self.labelvalues = per_engine_labelvalues
        self.counters = [prometheus_client.Counter(name=name, documentation=doc, labelnames=labelnames + ["rule"])
                         for name, doc in COUNTERS]
        self.totals: dict[str, list[int]] = {}
        self.warned: set[str] = set()

    def observe(self, stats: SpecDecodingStats, engine_idx: int = 0) -> None:
        for rule, counts in (getattr(stats, "rule_health", None) or {}).items():
            labels = [*self.labelvalues.get(engine_idx, [engine_idx]), rule]
            for counter, value in zip(self.counters, counts):
                if value:
                    counter.labels(*labels).inc(value)
            total = self.totals.setdefault(rule, [0, 0, 0])
            self.totals[rule] = [a + b for a, b in zip(total, counts)]
            self._warn_if_unhealthy(rule)

    def _warn_if_unhealthy(self, rule: str) -> None:
        rows, fallback, faults = self.totals[rule]
        if rule in self.warned or rows < MIN_ROWS_TO_WARN or fallback <= HIGH_FALLBACK_SHARE * rows:
            return
        self.warned.add(rule)
        logger.warning(
            "vllm-liliprop draft rule %r fell back to the drafter's argmax on %d of %d draft rows "
            "(%.0f%%, %d faulty steps): its head is not scoring; output stays lossless but its "
            "drafts are the drafter's. Check the head's weights (vllm:liliprop_rule_*_total).",
            rule, fallback, rows, 100.0 * fallback / rows, faults)
