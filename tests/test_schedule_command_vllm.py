"""`python -m eval schedule` on real engines: one engine per system times every k in turn
(OfflineEngine.pin_k), interleaved with plain decoding in rounds, and writes the scheduled
systems file and its measurements. Mechanics only: the tiny testbed's timings mean nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.engine import ENGINE_FLAGS

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "testbed/tiny"
FLAGS = {k: v for k, v in ENGINE_FLAGS.items() if k != "disable_log_stats"}


def _render(messages):
    return [5, 6, 7, 8] * 3  # any prompt ids: the tiny target has no chat template to honour


def test_pin_k_sets_how_many_tokens_each_request_drafts():
    from vllm_liliprop.vllm.offline import OfflineEngine, Sampling

    spec = {"method": "dflash", "model": str(TINY / "drafts/dflash"), "num_speculative_tokens": 3,
            "num_speculative_tokens_per_batch_size": [[1, 4, 3]]}
    sampling = Sampling(0.0, 12, None, True)
    with OfflineEngine(str(TINY / "target"), FLAGS, spec, None, max_num_seqs=4) as engine:
        drafted = {}
        for k in (0, 2, 3):
            engine.pin_k(k)
            counters = engine.run_batch([["a"], ["b"]], _render, sampling).counters
            drafted[k] = (counters.num_drafts, counters.num_draft_tokens)
        with pytest.raises(ValueError, match="k must be 0..num_speculative_tokens = 3"):
            engine.pin_k(4)
    assert drafted[0] == (0, 0)
    assert drafted[2][0] > 0 and drafted[2][1] == 2 * drafted[2][0], drafted
    assert drafted[3][0] > 0 and drafted[3][1] == 3 * drafted[3][0], drafted
    with OfflineEngine(str(TINY / "target"), FLAGS, None, None) as plain:
        with pytest.raises(RuntimeError, match="num_speculative_tokens_per_batch_size"):
            plain.pin_k(0)


def test_eval_schedule_times_every_arm_in_rounds_and_writes_the_schedule(tmp_path):
    from eval.cli import main

    out = tmp_path / "systems.json"
    code = main(["schedule", "--target", str(TINY / "target"), "--systems", str(TINY / "systems.json"),
                 "--var", f"testbed={TINY}", "--only", "DFlash", "--batch-sizes", "1,2",
                 "--tokens", "4,12", "--rounds", "2", "--prompts", "2",
                 "--served-batch-sizes", "2", "--served-prompts", "2", "--served-tokens", "6",
                 "--engine-flags", json.dumps(FLAGS), "--out", str(out)])
    assert code == 0
    systems = json.loads(out.read_text())
    assert set(systems) == {"AR", "DFlash", "DFlash-scheduled"}
    ranges = systems["DFlash-scheduled"]["speculative_config"]["num_speculative_tokens_per_batch_size"]
    assert ranges[0][0] == 1 and ranges[-1][1] == 2
    record = json.loads(out.with_suffix(".measurements.json").read_text())
    assert record["rounds"] == 2
    assert [len(t) for t in record["AR_step_costs_s_by_round"].values()] == [2, 2]
    measured = record["systems"]["DFlash"]
    assert sorted(measured["step_costs_s"], key=int) == [str(k) for k in range(8)]
    assert all(len(t) == 2 for by_b in measured["step_costs_s_by_round"].values() for t in by_b.values())
    assert set(measured["step_cost_over_plain"]["0"]) == {"1", "2"}
    assert len(measured["acceptance_per_pos"]) == 7
    # Served batches of 2 other held-out prompts, every k and plain decoding, each round.
    assert record["served_batch_sizes"] == [2] and len(record["AR_served_tokens_per_s_by_round"]["2"]) == 2
    assert sorted(measured["served_factors"], key=int) == [str(k) for k in range(1, 8)]  # k = 0: plain step
    assert set(measured["served_over_plain"]["0"]) == {"2"}
    # The model's plain step pools plain decoding's rounds with the k = 0 arm's.
    assert set(record["plain_step_costs_s"]) == {"1", "2"} and measured["step_costs_s"]["0"] == record["plain_step_costs_s"]
    assert all(f["2"] > 0 for f in measured["served_factors"].values())
    # Planned again from that file, for larger batches, without an engine.
    again = tmp_path / "again.json"
    assert main(["schedule", "--target", str(TINY / "target"), "--systems", str(TINY / "systems.json"),
                 "--var", f"testbed={TINY}", "--only", "DFlash", "--batch-sizes", "1,2", "--max-batch", "8",
                 "--served-batch-sizes", "2", "--from-measurements", str(out.with_suffix(".measurements.json")), "--out", str(again)]) == 0
    again_record = json.loads(again.with_suffix(".measurements.json").read_text())
    assert again_record["dtype"] == record["dtype"]
    replanned = again_record["systems"]["DFlash"]
    assert replanned["step_costs_s_by_round"] == measured["step_costs_s_by_round"]
    assert replanned["served_factors"] == measured["served_factors"]
    # A served size the file lacks is measured now (2 prompts through 1 slot, refilled), beside
    # the recorded one, which is kept as it was served.
    more = tmp_path / "more.json"
    assert main(["schedule", "--target", str(TINY / "target"), "--systems", str(TINY / "systems.json"),
                 "--var", f"testbed={TINY}", "--only", "DFlash", "--batch-sizes", "1,2", "--rounds", "2",
                 "--prompts", "2", "--served-batch-sizes", "1,2", "--served-prompts", "2",
                 "--served-tokens", "6", "--engine-flags", json.dumps(FLAGS),
                 "--from-measurements", str(out.with_suffix(".measurements.json")), "--out", str(more)]) == 0
    more_record = json.loads(more.with_suffix(".measurements.json").read_text())
    assert more_record["served_prompts_by_batch_size"] == {"1": 2, "2": 2}
    assert more_record["AR_served_tokens_per_s_by_round"]["2"] == record["AR_served_tokens_per_s_by_round"]["2"]
    assert len(more_record["AR_served_tokens_per_s_by_round"]["1"]) == 2
    assert all(set(f) == {"1", "2"} for f in more_record["systems"]["DFlash"]["served_factors"].values())
    assert main(["schedule", "--target", str(TINY / "target"), "--systems", str(TINY / "systems.json"),
                 "--var", f"testbed={TINY}", "--only", "DFlash", "--batch-sizes", "1,2",
                 "--served-batch-sizes", "1", "--served-tokens", "9",
                 "--from-measurements", str(out.with_suffix(".measurements.json")), "--out", str(more)]) == 2
    # The same measurements planned from the steady-state model alone.
    steady = tmp_path / "steady.json"
    assert main(["schedule", "--target", str(TINY / "target"), "--systems", str(TINY / "systems.json"),
                 "--var", f"testbed={TINY}", "--only", "DFlash", "--batch-sizes", "1,2", "--served-batch-sizes", "",
                 "--from-measurements", str(out.with_suffix(".measurements.json")), "--out", str(steady)]) == 0
    assert "served_factors" not in json.loads(steady.with_suffix(".measurements.json").read_text())["systems"]["DFlash"]
    ranges = json.loads(again.read_text())["DFlash-scheduled"]["speculative_config"]
    assert ranges["num_speculative_tokens_per_batch_size"][-1][1] == 8


def test_a_schedule_timed_at_t1_is_written_as_the_sampled_requests_k(tmp_path):
    """--temperature 1: every run sampled (seeded), the plan written as liliprop.sampled_k of
    DFlash+sampled-k (its ranges below the full k), the greedy schedule left to the system."""
    from eval.cli import main
    from eval.schedule import sampled_entry
    from vllm_liliprop.options import resolve_options

    out = tmp_path / "sampled.json"
    assert main(["schedule", "--target", str(TINY / "target"), "--systems", str(TINY / "systems.json"),
                 "--var", f"testbed={TINY}", "--only", "DFlash", "--batch-sizes", "1,2",
                 "--tokens", "4,12", "--rounds", "1", "--prompts", "2", "--temperature", "1",
                 "--engine-flags", json.dumps(FLAGS), "--out", str(out)]) == 0
    systems = json.loads(out.read_text())
    assert set(systems) == {"AR", "DFlash", "DFlash+sampled-k"}
    record = json.loads(out.with_suffix(".measurements.json").read_text())
    assert record["temperature"] == 1.0
    plan = record["systems"]["DFlash"]["schedule"]
    entry = systems["DFlash+sampled-k"]
    assert "num_speculative_tokens_per_batch_size" not in entry["speculative_config"]
    cuts = [r for r in plan if r[2] < 7]
    assert entry.get("liliprop", {}).get("sampled_k") == (cuts or None)
    if cuts:
        resolve_options(["DFlashDraftModel"], {"liliprop": entry["liliprop"]}, None)
    # The builder on a known plan: the full-k range cuts nothing and is left out.
    dflash = {"speculative_config": {"method": "dflash", "num_speculative_tokens": 3}}
    assert sampled_entry(dflash, [[1, 2, 3], [3, 16, 0]], "x")["liliprop"] == {"sampled_k": [[3, 16, 0]]}
    assert "liliprop" not in sampled_entry(dflash, [[1, 16, 3]], "x")
    assert main(["schedule", "--target", "x", "--systems", str(TINY / "systems.json"), "--var",
                 f"testbed={TINY}", "--only", "DFlash", "--temperature", "-1", "--out", str(out)]) == 2
