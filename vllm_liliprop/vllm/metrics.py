"""Speculative-decoding counters from `LLM.get_metrics()` as a small value type."""

from __future__ import annotations

from dataclasses import dataclass, field

_PREFIX = "vllm:spec_decode_"


@dataclass(frozen=True)
class SpecDecodeCounters:
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: tuple[int, ...] = field(default_factory=tuple)

    @property
    def tau(self) -> float:
        """Mean acceptance length per verification: 1 + accepted / drafts (1.0 with no drafts)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def acceptance_rate_per_pos(self) -> tuple[float, ...]:
        """Fraction of drafts whose token at position i (1-based i+1) was accepted."""
        if not self.num_drafts:
            return tuple(0.0 for _ in self.accepted_per_pos)
        return tuple(a / self.num_drafts for a in self.accepted_per_pos)

    def __add__(self, other: "SpecDecodeCounters") -> "SpecDecodeCounters":
        """Two runs' figures together (a row measured one prompt at a time)."""
        return self - (SpecDecodeCounters() - other)

    def __sub__(self, earlier: "SpecDecodeCounters") -> "SpecDecodeCounters":
        """Counters are cumulative; the difference of two reads is one run's figures."""
        width = max(len(self.accepted_per_pos), len(earlier.accepted_per_pos))
        mine = self.accepted_per_pos + (0,) * (width - len(self.accepted_per_pos))
        theirs = earlier.accepted_per_pos + (0,) * (width - len(earlier.accepted_per_pos))
        return SpecDecodeCounters(
            self.num_drafts - earlier.num_drafts,
            self.num_draft_tokens - earlier.num_draft_tokens,
            self.num_accepted_tokens - earlier.num_accepted_tokens,
            tuple(a - b for a, b in zip(mine, theirs)),
        )

    @classmethod
    def from_metrics(cls, metrics) -> "SpecDecodeCounters":
        """Read from the list `LLM.get_metrics()` returns (needs `disable_log_stats=False`)."""
        scalars: dict[str, int] = {}
        per_pos: tuple[int, ...] = ()
        for metric in metrics:
            if not metric.name.startswith(_PREFIX):
                continue
            key = metric.name[len(_PREFIX) :]
            if key == "num_accepted_tokens_per_pos":
                per_pos = tuple(int(v) for v in metric.values)
            elif hasattr(metric, "value"):
                scalars[key] = scalars.get(key, 0) + int(metric.value)
        return cls(
            scalars.get("num_drafts", 0),
            scalars.get("num_draft_tokens", 0),
            scalars.get("num_accepted_tokens", 0),
            per_pos,
        )

    @classmethod
    def read(cls, llm) -> "SpecDecodeCounters":
        return cls.from_metrics(llm.get_metrics())
