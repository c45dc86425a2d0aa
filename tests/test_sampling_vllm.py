"""Temperature 1: speculation with the lattice and DeLS rules keeps the target's distribution.

A peaky tiny target (one token takes ~70% of the mass) makes drafts get accepted often, so both
the acceptance and the recovery paths of rejection sampling are exercised. The drafter always
proposes the same four candidates (the target's most frequent tokens); a lattice head that
scores rank 0 one logit above the others walks them, deterministically (always rank 0) or by
sampling (rank 0 about half the time) with its exact distributions handed to vLLM. The
joint distribution of three sampled tokens is compared with plain sampling by a chi-square test
on independent seeds; a real bias at the drafted tokens (e.g. draft probabilities that do not
match the sampled drafts) moves the mass of the frequent triples by far more than the test's
resolution at this sample size.
"""

import json
from collections import Counter
from pathlib import Path

import pytest

from eval.distribution import chi_square_p
from tests.builders import attach_markov_head, build_rank_preferring_lilicorr
from tests.engine import generate
from vllm_liliprop.fixtures import build_tiny_target

pytestmark = pytest.mark.vllm
N = 1500
PROMPT = "x = "


@pytest.fixture(scope="module")
def peaky(tiny_models):
    root = tiny_models["root"]
    target = build_tiny_target(root / "peaky-target", logit_gain=16.0)
    plain, _, _ = generate(target, None, prompts=[PROMPT] * N, max_tokens=3, temperature=1.0,
                           seeds=list(range(N)))
    ranked = [t for t, _ in Counter(t for ys in plain for t in ys[1:]).most_common(4)]
    draft = build_rank_preferring_lilicorr(root / "peaky-lilicorr", target, ranked, rank=0)
    config = json.loads((draft / "config.json").read_text())
    config["dflash_config"]["lilicorr_logit_scale"] = 1.0  # sampled walk: P(rank 0) ~ e/(e+3)
    (draft / "config.json").write_text(json.dumps(config))
    attach_markov_head(draft, target, ranked[1], strength=2.0)
    return {"target": str(target), "draft": str(draft), "plain": plain}


@pytest.mark.parametrize(
    "options",
    [
        {"rule": "lattice", "sampling": "deterministic"},
        {"rule": "lattice", "sampling": "probabilistic"},
        {"rule": "dels", "sampling": "probabilistic"},
        # The hybrid: found rows are one-hot drafts beside the head's sampled distributions.
        {"rule": "lattice", "sampling": "probabilistic", "prompt_lookup": [1, 2]},
        # ...and the head's block cut to one slot: vLLM verifies a prefix of its distributions.
        {"rule": "lattice", "sampling": "probabilistic", "prompt_lookup": [1, 2],
         "rule_draft_length": 1},
    ],
    ids=["lattice-deterministic", "lattice-probabilistic", "dels-probabilistic", "lattice-lookup",
         "lattice-lookup-cut"],
)
def test_sampled_output_distribution_matches_plain_sampling(peaky, options):
    spec, counters, drafter = generate(peaky["target"], peaky["draft"], options=options,
                                       prompts=[PROMPT] * N, max_tokens=3, temperature=1.0,
                                       seeds=list(range(N, 2 * N)))
    assert drafter.num_rule_faults == 0
    assert counters.num_accepted_tokens > 0.1 * counters.num_drafts
    assert chi_square_p(spec, peaky["plain"]) > 1e-3


def test_chi_square_detects_a_shift_of_the_size_a_bias_would_cause(peaky):
    """Power check on the same data: moving 10% of samples from the top triple to the second one
    is detected. Real faults are far larger: without this package's CPU expand-kernel fix, stock
    DFlash here accepts 0.1% of drafts instead of ~75% and p falls below 1e-20."""
    plain = [tuple(x) for x in peaky["plain"]]
    (top, _), (second, _) = Counter(plain).most_common(2)
    biased = list(plain)
    moved = 0
    for i, x in enumerate(biased):
        if x == top and moved < len(plain) // 10:
            biased[i] = second
            moved += 1
    assert chi_square_p(biased, plain) < 1e-3


def test_sampled_output_distribution_under_a_speculation_schedule(peaky):
    """vLLM's k-by-batch-size schedule (k = 0 when the batch is large, 2 as it drains) with the
    sampled lattice walk: the distribution stays the target's."""
    schedule = {"num_speculative_tokens_per_batch_size": [[1, 32, 2], [33, 256, 0]]}
    spec, counters, drafter = generate(peaky["target"], peaky["draft"],
                                       options={"rule": "lattice", "sampling": "probabilistic"},
                                       prompts=[PROMPT] * N, max_tokens=3, temperature=1.0,
                                       seeds=list(range(N, 2 * N)), spec_extra=schedule,
                                       extra_flags={"max_num_seqs": 64})
    assert drafter.num_rule_faults == 0
    assert counters.num_drafts > 0 and counters.num_accepted_tokens > 0.1 * counters.num_drafts
    assert chi_square_p(spec, peaky["plain"]) > 1e-3
