"""--paired: an AR reference that is an outlier against the job's other AR runs is measured again.

The rule is plots.paired.is_outlier (tokens/s outside [median / 2, median * 2] of the job's AR
rows and accepted paired references; why there). A stall during the reference run inflates the
system's speedup; measured again a few seconds later, the reference usually runs at the job's
speed. A reference still an outlier after RETRIES more runs is kept in the row, marked
(`paired_ar_outlier`), and its speedup is not used.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from plots.paired import is_outlier

RETRIES = 2


@dataclass(frozen=True)
class CheckedReference:
    result: object  # the last BatchResult measured (output_tokens, wall_s)
    retries: int  # how many times it was measured again
    outlier: bool  # still an outlier after the retries: the row's speedup is not used

    @property
    def tokens_per_s(self) -> float:
        return rate(self.result)


def rate(result) -> float:
    return result.output_tokens / result.wall_s if result.wall_s > 0 else math.nan


def checked_reference(measure: Callable[[], object], job_rates: list[float],
                      retries: int = RETRIES) -> CheckedReference:
    """measure() runs AR on the row's prompts; again while its tokens/s is an outlier against
    job_rates, at most `retries` more times."""
    result, tries = measure(), 0
    while tries < retries and is_outlier(rate(result), job_rates):
        result, tries = measure(), tries + 1
    return CheckedReference(result, tries, is_outlier(rate(result), job_rates))
