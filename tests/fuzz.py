"""Shared pieces of the input-fuzzing suites (tests/test_fuzz_*.py): Hypothesis strategies for
what a user may hand in, and the check that a refusal is a clear one.

A bad input must end in the project's own error (or a ValueError) whose message names where the
input came from (a file, row or field); a TypeError, KeyError, AttributeError, IndexError or any
other exception from inside the package fails the property.
"""

from __future__ import annotations

import json
import os
import string

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# Modest: every suite together runs in well under a minute on 2 cores. A longer hunt:
# LILIPROP_FUZZ_EXAMPLES=2000 (how the failures listed in the suites were found). Under CI the
# examples are derandomized, so a landing is decided by the code, not by the draw; a local run
# explores new inputs each time (LILIPROP_FUZZ_RANDOM=0 fixes them there too).
FUZZ = settings(max_examples=int(os.environ.get("LILIPROP_FUZZ_EXAMPLES", "60")), deadline=None, database=None,
                derandomize=os.environ.get("LILIPROP_FUZZ_RANDOM", "0" if os.environ.get("CI") else "1") == "0",
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Text a user's file may hold: any Unicode, with the characters that break formats made likely.
text = st.one_of(st.text(max_size=30), st.sampled_from(["", " ", "\n", "${x}", "NaN", "1e999", "-1",
                                                          "true", "null", "{}", "[]", '"', "\\",
                                                          "<|im_end|>", "\u0000", "\ud7ff"]))
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=10**400, max_value=10**401),
                    st.floats(allow_nan=True, allow_infinity=True), text)
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)), max_leaves=12)
keys = st.text(alphabet=string.ascii_lowercase + "._-", min_size=0, max_size=12)


def dumps(value) -> str:
    """JSON as Python writes it (NaN and Infinity included, as JSON readers accept them)."""
    return json.dumps(value)


def check_refusal(error: BaseException, allowed: tuple[type[BaseException], ...], *names: str) -> None:
    """`error` is one of `allowed` and its message names at least one of `names` (the file, the
    row or the field); otherwise the original error is raised again, with its traceback."""
    message = str(error)
    if not isinstance(error, allowed) or (names and not any(n in message for n in names)):
        raise AssertionError(f"unclear refusal {type(error).__name__}: {message[:300]!r} "
                             f"(expected {[a.__name__ for a in allowed]} naming one of {names})") from error
