"""A draft rule's health in vLLM's own metrics: per rule, draft rows, fallback rows, faults, and
its accepted tokens next to those of the drafter's argmax on the same verified rows.

A head can fault (non-finite scores, an exception): its rows then fall back to the drafter's
argmax. It can also saturate while serving (finite scores that no longer mean anything): then
nothing faults, but its drafts are far worse than the argmax's. Output stays lossless either
way, and only these counters tell the operator. They travel the way vLLM's own spec-decode
counters do:

1. each `LiliPropProposer` with a rule registers here (`register_source`); it counts the rows
   it drafted, the rows that fell back, its faults, and (acceptance_tracker.py) the verified
   rows with the rule's and the argmax's accepted tokens (`LiliPropProposer.rule_health`);
2. the scheduler's `make_stats` (patched) drains the counts since its last call into the step's
   `SpecDecodingStats`, as a `RuleSpecDecodingStats` (one more field, `rule_health`, which the
   patched `SchedulerStats` annotation lets vLLM's msgpack decoder keep);
3. in the frontend, `SpecDecodingProm.observe` (patched) adds them to the Prometheus counters
   `COUNTERS`, registered beside vLLM's (`vllm:liliprop_rule_*_total`, labels model_name,
   engine, rule), so they appear in the OpenAI server's `/metrics` and in `LLM.get_metrics()`;
   a rule whose fallback share passes `HIGH_FALLBACK_SHARE`, or whose accepted tokens fall below
   `LOW_ACCEPTANCE_RATIO` of the argmax's, is logged there once (`WARNINGS`).

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
    ("vllm:liliprop_rule_verified_rows",
     "Draft rows whose verified tokens were compared with the rule's and the drafter's argmax drafts."),
    ("vllm:liliprop_rule_accepted_tokens",
     "On the verified rows: leading draft tokens of the rule that the target accepted."),
    ("vllm:liliprop_rule_argmax_accepted_tokens",
     "On the verified rows: leading tokens of the drafter's argmax draft that equal the verified "
     "tokens (a lower bound of what the argmax would have had accepted)."),
)
HIGH_FALLBACK_SHARE = 0.2  # warn once a rule's fallback rows pass this share of its draft rows...
MIN_ROWS_TO_WARN = 64  # ...after this many draft rows (and verified rows, for the next warning)
# Warn once a rule's accepted tokens fall below this share of the argmax's on the same rows (a
# healthy head is within a few tens of percent of its drafter's argmax, better or worse; a
# saturated one accepts next to nothing)...
LOW_ACCEPTANCE_RATIO = 0.5
MIN_ARGMAX_ACCEPTED_TO_WARN = 32  # ...once the argmax has this many accepted tokens to compare with

# Live proposers -> their counts at the last drain. Keyed weakly, not by id(): an engine's
# proposer freed and a new one allocated at the same address would otherwise inherit the old
# counts and drain a negative delta, which Prometheus refuses by raising inside the engine.
_last: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def register_source(proposer) -> None:
    """A proposer whose `rule_health()` -> (rule, *counts), cumulative, counts as `COUNTERS`."""
    _last[proposer] = (0,) * len(COUNTERS)


def drain() -> dict[str, list[int]]:
    """rule -> counts (as `COUNTERS`) since the last drain, over live sources."""
    out: dict[str, list[int]] = {}
    for source, before in list(_last.items()):
        rule, *counts = source.rule_health()
        _last[source] = tuple(counts)
        delta = [now - then for now, then in zip(counts, before)]
        if any(delta):
            out[rule] = [a + b for a, b in zip(out.get(rule, [0] * len(COUNTERS)), delta)]
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
    """The counters, per engine and rule, and the one-time warnings: a high fallback share, and
    an acceptance far below the drafter's argmax."""

    def __init__(self, labelnames: list[str], per_engine_labelvalues: dict[int, list[object]]):
        self.labelvalues = per_engine_labelvalues
        self.counters = [prometheus_client.Counter(name=name, documentation=doc, labelnames=labelnames + ["rule"])
                         for name, doc in COUNTERS]
        self.totals: dict[str, list[int]] = {}
        self.warned: set[tuple[str, str]] = set()  # (rule, what)

    def observe(self, stats: SpecDecodingStats, engine_idx: int = 0) -> None:
        for rule, counts in (getattr(stats, "rule_health", None) or {}).items():
            labels = [*self.labelvalues.get(engine_idx, [engine_idx]), rule]
            for counter, value in zip(self.counters, counts):
                counter.labels(*labels).inc(value)  # a 0 too: every series shows from the start
            total = self.totals.setdefault(rule, [0] * len(COUNTERS))
            self.totals[rule] = [a + b for a, b in zip(total, counts)]
            for what, warn in WARNINGS.items():
                if (rule, what) not in self.warned and warn(rule, *self.totals[rule]):
                    self.warned.add((rule, what))


def _warn_high_fallback(rule: str, rows: int, fallback: int, faults: int, *_) -> bool:
    if rows < MIN_ROWS_TO_WARN or fallback <= HIGH_FALLBACK_SHARE * rows:
        return False
    logger.warning(
        "vllm-liliprop draft rule %r fell back to the drafter's argmax on %d of %d draft rows "
        "(%.0f%%, %d faulty steps): its head is not scoring; output stays lossless but its "
        "drafts are the drafter's. Check the head's weights (vllm:liliprop_rule_*_total).",
        rule, fallback, rows, 100.0 * fallback / rows, faults)
    return True


def _warn_low_acceptance(rule: str, *counts: int) -> bool:
    verified, accepted, argmax = counts[3:6]
    if (verified < MIN_ROWS_TO_WARN or argmax < MIN_ARGMAX_ACCEPTED_TO_WARN
            or accepted >= LOW_ACCEPTANCE_RATIO * argmax):
        return False
    logger.warning(
        "vllm-liliprop draft rule %r had %d draft tokens accepted over %d verified draft rows "
        "(%.2f a draft) where the drafter's argmax would have had at least %d (%.2f a draft), "
        "below %.0f%% of it: its head scores without faulting but drafts far worse than the "
        "drafter alone (saturated or mismatched weights?). Output stays lossless; serve the "
        "draft with rule 'argmax' or check the head (vllm:liliprop_rule_*_total).",
        rule, accepted, verified, accepted / verified, argmax, argmax / verified,
        100 * LOW_ACCEPTANCE_RATIO)
    return True


# Each one-time warning: (rule, *totals as COUNTERS) -> whether it logged.
WARNINGS = {"high_fallback": _warn_high_fallback, "low_acceptance": _warn_low_acceptance}
