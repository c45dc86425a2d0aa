"""A draft rule's health in vLLM's own metrics (vllm_liliprop/vllm/rule_health.py).

A head broken at run time (its rows all fall back to the drafter's argmax) must show in
`LLM.get_metrics()` offline and in the OpenAI server's `/metrics` (engine core in a process of
its own, so the counts cross vLLM's msgpack boundary), with one warning in the log. So must a
head that saturates without faulting (finite scores, useless drafts): its accepted tokens next
to the drafter's argmax's on the same verified rows, and a warning; a healthy head warns not.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess

from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.builders import attach_random_gru_head
from tests.engine import PROMPTS, generate
from tests.test_http_serving_vllm import ROOT, completion, free_port, metric, serve_command, stop, wait_until_healthy
from tests.test_rule_faults_vllm import poison

pytestmark = [pytest.mark.vllm]
NAMES = ("vllm:liliprop_rule_draft_rows", "vllm:liliprop_rule_fallback_rows", "vllm:liliprop_rule_faults")
ACCEPTANCE = ("vllm:liliprop_rule_verified_rows", "vllm:liliprop_rule_accepted_tokens",
              "vllm:liliprop_rule_argmax_accepted_tokens")
TESTBED = Path(__file__).resolve().parents[1] / "testbed" / "tiny"
# The tiny testbed's trained drafter and DeLS-Markov head, on its held-out code prompts: the
# argmax accepts enough there for the comparison to mean something.
MARKOV = {"rule": "dels", "dels_path": "dels_markov"}
SATURATED = -3e38  # a log-prior this low is finite, but swamps every score it is added to


def _spy_warnings(monkeypatch) -> list[str]:
    from vllm_liliprop.vllm import rule_health

    warnings, warn = [], rule_health.logger.warning
    # A spy, not a stand-in: it keeps the text and logs it as before (pytest's output capture
    # and vLLM's log handlers disagree about which stream is live across a session).
    monkeypatch.setattr(rule_health.logger, "warning",
                        lambda msg, *args, **kw: (warnings.append(msg % args), warn(msg, *args, **kw)))
    return warnings


def _testbed_run(prepare=None):
    prompts = [json.loads(line)["turns"][0]
               for line in (TESTBED / "eval" / "testbed" / "code.jsonl").read_text().splitlines()[:5]]
    metrics: dict[str, float] = {}
    ids, counters, _ = generate(str(TESTBED / "target"), str(TESTBED / "drafts" / "dflash"),
                                options=MARKOV, prompts=prompts, max_tokens=64, prepare=prepare,
                                metrics_out=metrics)
    return ids, counters, metrics


LOW_ACCEPTANCE = r"draft rule 'dels' had (\d+) draft tokens accepted over (\d+) verified draft rows"


def test_a_saturated_head_shows_in_the_metrics_and_warns_once(healthy_markov_warnings, monkeypatch):
    warnings = _spy_warnings(monkeypatch)
    ids, counters, metrics = _testbed_run(poison(lambda d: d.draft_rule.log_prior, SATURATED))
    rows, fallback, faults = (metrics[name] for name in NAMES)
    verified, accepted, argmax = (metrics[name] for name in ACCEPTANCE)
    assert ids == healthy_markov_warnings[0][0]  # lossless, and nothing faulted: the head is served as is
    assert rows > 0 and fallback == faults == 0
    # Every draft vLLM verified was compared; the rule's count is vLLM's own.
    assert verified == counters.num_drafts and accepted == counters.num_accepted_tokens
    assert argmax >= 32 and accepted < 0.5 * argmax
    low = [w for w in warnings if re.search(LOW_ACCEPTANCE, w)]
    assert len(low) == 1 and len(warnings) == 1, warnings


@pytest.fixture(scope="module")
def healthy_markov_warnings():
    """The healthy run of the module's fixture, with the warnings it logged."""
    monkeypatch = pytest.MonkeyPatch()
    try:
        warnings = _spy_warnings(monkeypatch)
        return _testbed_run(), warnings
    finally:
        monkeypatch.undo()


def test_a_healthy_head_does_not_warn_and_counts_what_vllm_counts(healthy_markov_warnings):
    (_, counters, metrics), warnings = healthy_markov_warnings
    verified, accepted, argmax = (metrics[name] for name in ACCEPTANCE)
    assert verified == counters.num_drafts > 0 and accepted == counters.num_accepted_tokens
    assert accepted >= argmax > 0  # on this testbed the Markov head beats its drafter's argmax
    assert not any("draft rule" in w for w in warnings), warnings


def test_offline_metrics_count_every_fallback_row_of_a_broken_head(tiny_models, monkeypatch):
    draft = tiny_models["root"] / "health-dels-gru"
    shutil.copytree(tiny_models["draft"], draft, dirs_exist_ok=True)
    attach_random_gru_head(draft, tiny_models["target"])
    from vllm_liliprop.vllm import rule_health

    warnings, warn = [], rule_health.logger.warning
    # A spy, not a stand-in: it keeps the text and logs it as before (pytest's output capture
    # and vLLM's log handlers disagree about which stream is live across a session).
    monkeypatch.setattr(rule_health.logger, "warning",
                        lambda msg, *args, **kw: (warnings.append(msg % args), warn(msg, *args, **kw)))
    metrics: dict[str, float] = {}
    _, counters, drafter = generate(tiny_models["target"], draft, options={"rule": "dels"},
                                    prepare=poison(lambda d: d.draft_rule.head.gru.weight_hh_l0),
                                    metrics_out=metrics)
    rows, fallback, faults = (metrics[name] for name in NAMES)
    # One row per request and draft step, every one of them fell back; one fault per step.
    assert rows == drafter.num_draft_rows == drafter.num_rule_faults > 0
    assert fallback == rows and 0 < faults <= rows
    # vLLM counts the drafts it verified: all of them but each request's last, drafted on the
    # step that finished it.
    assert counters.num_drafts == rows - len(PROMPTS)
    assert len(warnings) == 1 and re.search(
        r"draft rule 'dels' fell back to the drafter's argmax on (\d+) of \1 draft rows", warnings[0])


def _nan_drafter(source, out):
    """A copy of the DFlash draft whose final norm is NaN: vLLM loads it, every row faults."""
    shutil.copytree(source, out)
    weights = load_file(str(out / "model.safetensors"))
    name = next(n for n in weights if n.removeprefix("model.") == "norm.weight")
    weights[name] = torch.full_like(weights[name], math.nan)
    save_file(weights, str(out / "model.safetensors"))
    return out


@pytest.mark.slow
def test_served_metrics_show_the_rule_counters_over_http(tiny_models, tmp_path):
    draft = _nan_drafter(tiny_models["draft"], tmp_path / "nan-draft")
    port, log = free_port(), tmp_path / "server.log"
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0",
               VLLM_LILIPROP_OPTIONS=json.dumps({"rule": "argmax"}))
    with log.open("w") as out:
        proc = subprocess.Popen(serve_command(tiny_models["target"], draft, port), cwd=ROOT,
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until_healthy(proc, f"http://127.0.0.1:{port}", log)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            for prompt in ("def fib(n):", "import os\nimport", "class A:\n    def", "for i in range("):
                completion(client, prompt, stream=False)
            text = client.get("/metrics").text
    finally:
        leftovers = stop(proc)
    (tmp_path.parent / "rule_health_metrics.txt").write_text(text)  # the report's sample
    rows, fallback, faults = (metric(text, name + "_total") for name in NAMES)
    assert 'rule="argmax"' in text and rows > 0 and fallback == rows and 0 < faults <= rows
    assert metric(text, "vllm:spec_decode_num_drafts_total") == rows - 4  # each request's last unverified
    # The acceptance counters: every verified draft compared; all rows fell back, so the rule's
    # drafts were the argmax's and both counts are vLLM's own.
    verified, accepted, argmax = (metric(text, name + "_total") for name in ACCEPTANCE)
    assert verified == rows - 4
    assert accepted == argmax == metric(text, "vllm:spec_decode_num_accepted_tokens_total")
    assert "draft rule 'argmax' fell back to the drafter's argmax on" in log.read_text()
    assert leftovers == []


def test_the_metrics_patches_are_idempotent():
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.metrics.stats import SchedulerStats
    from vllm.v1.spec_decode.metrics import SpecDecodingProm

    from vllm_liliprop.vllm import patching, rule_health

    patching.apply_patches()
    patched = Scheduler.__dict__["make_stats"], SpecDecodingProm.__dict__["observe"]
    patching.apply_patches()
    assert (Scheduler.__dict__["make_stats"], SpecDecodingProm.__dict__["observe"]) == patched
    assert all(getattr(f, "__liliprop_original__", None) is not None for f in patched)
    hint = SchedulerStats.__dataclass_fields__["spec_decoding_stats"].type
    assert hint == rule_health.RuleSpecDecodingStats | None


class _Counts:
    """A stand-in source with settable cumulative counts (a proposer's rule_health())."""

    def __init__(self, *counts):
        self.counts = counts

    def rule_health(self):
        return ("greedy", *self.counts)


def test_a_freed_proposers_counts_never_become_a_new_ones_baseline():
    # CI once failed here: counts were keyed by id(), a new engine's proposer reused a freed one's
    # address, drained a negative delta, and Prometheus raised inside the engine's step.
    import gc

    from vllm_liliprop.vllm import rule_health

    rule_health.drain()
    for _ in range(50):  # re-allocations at one address are likely, not certain; many give many chances
        old = _Counts(100, 40, 2, 90, 30, 60)
        rule_health.register_source(old)
        assert rule_health.drain() == {"greedy": [100, 40, 2, 90, 30, 60]}
        del old
        gc.collect()
        new = _Counts(3, 1, 0, 2, 1, 1)
        rule_health.register_source(new)
        assert rule_health.drain() == {"greedy": [3, 1, 0, 2, 1, 1]}
        del new
        gc.collect()
    assert rule_health.drain() == {}
