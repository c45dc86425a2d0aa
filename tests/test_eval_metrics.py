"""eval metric arithmetic from known counters, and the results file's resume identity and speedups."""

import json
import math

import pandas as pd
import pytest

from eval.metrics import run_metrics, speedup
from eval.results import ResultsFile, config_hash, identity
from eval.schema import ALL_COLUMNS
from vllm_liliprop.vllm.metrics import SpecDecodeCounters


def test_tau_and_per_position_rates_from_known_counters():
    counters = SpecDecodeCounters(num_drafts=10, num_draft_tokens=70, num_accepted_tokens=25,
                                  accepted_per_pos=(8, 6, 5, 3, 2, 1, 0))
    m = run_metrics(counters, output_tokens=350, wall_s=2.0)
    assert m["tau"] == pytest.approx(3.5)  # 1 + 25 / 10
    assert m["accept_per_pos"] == pytest.approx([0.8, 0.6, 0.5, 0.3, 0.2, 0.1, 0.0])
    assert sum(counters.accepted_per_pos) == counters.num_accepted_tokens
    assert m["tokens_per_s"] == pytest.approx(175.0)
    assert (m["num_drafts"], m["num_draft_tokens"], m["num_accepted_tokens"]) == (10, 70, 25)


def test_tau_is_block_weighted_over_the_whole_run():
    # Two requests: 1 draft accepting 6, and 4 drafts accepting 0 each. Per-request means would
    # give (7 + 1) / 2 = 4; block-weighted: 1 + 6 / 5 = 2.2.
    before = SpecDecodeCounters(3, 21, 4, (2, 1, 1))
    after = SpecDecodeCounters(8, 56, 10, (3, 2, 2, 1, 1, 1))
    run = after - before
    assert (run.num_drafts, run.num_accepted_tokens) == (5, 6)
    assert run.accepted_per_pos == (1, 1, 1, 1, 1, 1)
    assert run_metrics(run, 60, 1.0)["tau"] == pytest.approx(2.2)


def test_autoregressive_run_has_tau_one_and_no_positions():
    m = run_metrics(SpecDecodeCounters(), output_tokens=100, wall_s=4.0)
    assert m["tau"] == 1.0 and m["accept_per_pos"] == [] and m["tokens_per_s"] == 25.0
    assert math.isnan(run_metrics(SpecDecodeCounters(), 100, 0.0)["tokens_per_s"])


def test_speedup_over_the_baseline():
    assert speedup(150.0, 100.0) == pytest.approx(1.5)
    assert math.isnan(speedup(150.0, None))
    assert math.isnan(speedup(150.0, 0.0))
    assert math.isnan(speedup(math.nan, 100.0))


FLAGS = json.dumps({"max_model_len": 512, "env": {"OMP_NUM_THREADS": "1"}})
PROTOCOL = json.dumps({"max_tokens": 16})


def _row(system="DFlash", tokens_per_s=100.0, concurrency=1, temperature=0.0, **extra):
    row = {c: "" for c in ALL_COLUMNS}
    row.update(kind="run", system=system, benchmark="gsm8k", category="", temperature=temperature,
               concurrency=concurrency, input_len=0, seed=42, dels_alpha=math.nan,
               dels_beta=math.nan, stage="", num_prompts=2, num_drafts=1, num_draft_tokens=7,
               num_accepted_tokens=3, tau=4.0, accept_per_pos=[1.0, 1.0, 1.0, 0, 0, 0, 0],
               output_tokens=32, wall_s=0.32, tokens_per_s=tokens_per_s, speedup=math.nan,
               stage_ms=math.nan, target="/m/target", engine_flags=FLAGS, protocol=PROTOCOL,
               system_config=json.dumps({"speculative_config": None if system == "AR" else {"method": "dflash"}}))
    row.update(extra)
    return row


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_results_file_round_trip_and_resume_identity(tmp_path, suffix):
    path = tmp_path / f"results{suffix}"
    results = ResultsFile(path)
    results.append(_row("AR", 80.0))
    results.append(_row("DFlash", 120.0, dels_alpha=0.3, dels_beta=0.1))
    reread = ResultsFile(path)
    assert reread.has(_row("AR", 80.0)) and reread.has(_row("DFlash", dels_alpha=0.3, dels_beta=0.1))
    assert not reread.has(_row("DFlash"))  # other (alpha, beta): another measurement
    assert not reread.has(_row("AR", temperature=1.0))
    # A changed system config, target, flag or protocol is a new measurement...
    assert not reread.has(_row("AR", system_config='{"speculative_config": {"method": "ngram"}}'))
    assert not reread.has(_row("AR", engine_flags=json.dumps({"max_model_len": 1024})))
    assert not reread.has(_row("AR", protocol=json.dumps({"max_tokens": 32})))
    # ...but the recorded environment is provenance only.
    assert reread.has(_row("AR", engine_flags=json.dumps({"max_model_len": 512, "env": {}})))
    frame = pd.read_csv(path) if suffix == ".csv" else pd.read_parquet(path)
    assert list(frame.columns) == ALL_COLUMNS and len(frame) == 2
    assert json.loads(frame["accept_per_pos"][0]) == [1.0, 1.0, 1.0, 0, 0, 0, 0]


def test_speedup_baseline_is_the_same_setting(tmp_path):
    results = ResultsFile(tmp_path / "r.csv")
    results.append(_row("AR", 80.0))
    results.append(_row("AR", 200.0, concurrency=4))
    results = ResultsFile(tmp_path / "r.csv")  # matching must survive the CSV round trip
    assert results.baseline_tokens_per_s(_row(), "AR") == 80.0
    assert results.baseline_tokens_per_s(_row(concurrency=4), "AR") == 200.0
    assert results.baseline_tokens_per_s(_row(temperature=1.0), "AR") is None
    assert results.baseline_tokens_per_s(_row(protocol="{}"), "AR") is None


def test_identity_normalizes_csv_strings():
    typed = _row("AR")
    as_text = {k: ("" if isinstance(v, float) and math.isnan(v) else str(v)) for k, v in typed.items()}
    assert identity(typed) == identity(as_text)
    assert config_hash("{}", "t", FLAGS, "{}") == config_hash("{}", "t", json.dumps({"max_model_len": 512}), "{}")


def test_results_file_refuses_other_suffix_and_other_schema(tmp_path):
    with pytest.raises(ValueError, match=r"\.csv or \.parquet"):
        ResultsFile(tmp_path / "r.json")
    (tmp_path / "old.csv").write_text("kind,system\nrun,AR\n")
    with pytest.raises(ValueError, match="lacks column"):
        ResultsFile(tmp_path / "old.csv")


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_file_from_before_the_later_columns_keeps_every_row_when_appended_to(tmp_path, suffix):
    from eval.schema import LATER_COLUMNS

    path = tmp_path / f"old{suffix}"
    old = pd.DataFrame([{**_row("AR", 80.0), "accept_per_pos": "[]"}]).drop(columns=LATER_COLUMNS)
    old.to_csv(path, index=False) if suffix == ".csv" else old.astype(str).to_parquet(path)
    results = ResultsFile(path)
    assert results.has(_row("AR", 80.0))
    results.append(_row("DFlash", 120.0, num_truncated=2))
    frame = pd.read_csv(path) if suffix == ".csv" else pd.read_parquet(path)
    # Appending a longer row under the old header would shift its fields: the file is rewritten
    # under today's header, the old row's new columns empty.
    assert list(frame.columns) == ALL_COLUMNS
    assert list(frame["system"]) == ["AR", "DFlash"] and list(frame["tokens_per_s"].astype(float)) == [80.0, 120.0]
    assert pd.isna(frame["num_truncated"][0]) and int(frame["num_truncated"][1]) == 2
    assert ResultsFile(path).has(_row("AR", 80.0)) and ResultsFile(path).has(_row("DFlash", 120.0))
