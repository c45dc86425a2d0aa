"""`python -m eval run` end to end: AR + DFlash on the tiny models, resume, summary."""

import json
import math

import pandas as pd
import pytest

from eval.cli import main
from eval.schema import ALL_COLUMNS
from tests.test_eval_loaders import DATA

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _command(tiny_models, tmp_path):
    systems = tmp_path / "systems.json"
    systems.write_text(json.dumps({
        "AR": {},
        "DFlash": {"speculative_config": {"method": "dflash", "model": "${draft}",
                                          "num_speculative_tokens": 7}},
    }))
    return ["run", "--target", tiny_models["target"], "--systems", str(systems),
            "--var", f"draft={tiny_models['draft']}", "--benchmarks", "gsm8k,mtbench",
            "--data-dir", str(DATA), "--limit", "2", "--temperatures", "0,1", "--seeds", "42",
            "--max-tokens", "16", "--ignore-eos", "--no-progress",
            "--engine-flags", json.dumps({"dtype": "float32", "max_model_len": 512, "enforce_eager": True}),
            "--stages", "DFlash", "--results", str(tmp_path / "results.csv")]


def test_run_writes_every_column_resumes_and_summarizes(tiny_models, tmp_path, capsys, monkeypatch):
    code = main(_command(tiny_models, tmp_path))
    printed, errors = capsys.readouterr()
    assert code == 0, errors
    frame = pd.read_csv(tmp_path / "results.csv")
    assert list(frame.columns) == ALL_COLUMNS
    runs = frame[frame["kind"] == "run"]
    assert len(runs) == 2 * 2 * 2  # systems x benchmarks x temperatures (one seed)
    assert (runs["concurrency"] == 1).all() and (runs["num_prompts"] == 2).all()
    # ignore_eos: gsm8k = 2 prompts x 16 tokens, mtbench = 2 prompts x 2 turns x 16 tokens.
    assert dict(zip(runs["benchmark"], runs["output_tokens"])) == {"gsm8k": 32, "mtbench": 64}
    ar, dflash = runs[runs["system"] == "AR"], runs[runs["system"] == "DFlash"]
    assert (ar["tau"] == 1.0).all() and (ar["speedup"] == 1.0).all() and (ar["num_drafts"] == 0).all()
    assert (dflash["num_drafts"] > 0).all() and (dflash["num_draft_tokens"] == 7 * dflash["num_drafts"]).all()
    for _, row in dflash.iterrows():
        assert row["tau"] == pytest.approx(1 + row["num_accepted_tokens"] / row["num_drafts"])
        assert len(json.loads(row["accept_per_pos"])) == 7
        match = ar[(ar["benchmark"] == row["benchmark"]) & (ar["temperature"] == row["temperature"])]
        assert row["speedup"] == pytest.approx(row["tokens_per_s"] / match["tokens_per_s"].item())
        assert row["draft"] == tiny_models["draft"] and len(row["checkpoint_hash"]) == 16
        assert json.loads(row["system_config"])["speculative_config"]["method"] == "dflash"
    assert list(runs["tokens_per_s"]) == pytest.approx(list(runs["output_tokens"] / runs["wall_s"]))
    assert runs["engine_flags"].nunique() == 1 and runs["protocol"].nunique() == 1
    assert json.loads(runs["engine_flags"].iloc[0])["max_model_len"] == 512
    assert (runs["vllm_version"].astype(str).str.startswith("0.")).all()
    stages = frame[frame["kind"] == "stage"]
    assert list(stages["stage"]) == ["target verify", "draft backbone", "LM head", "speculative head",
                                     "accept", "step wall"]
    assert (stages["system"] == "DFlash").all() and (stages["benchmark"] == "mtbench").all()
    assert (stages["stage_ms"] > 0).all() and stages["speedup"].isna().all()
    wall = stages.set_index("stage")["stage_ms"]
    assert wall["target verify"] + wall["draft backbone"] < wall["step wall"]
    # The summary: Table-1 style markdown with the best per row marked.
    assert "### tau" in printed and "### speedup" in printed and "### stages (ms per step)" in printed
    assert "| Benchmark | T | AR | DFlash |" in printed and "| gsm8k | 0 |" in printed and "**" in printed

    # Resume: every row is done, so no engine may even start.
    from vllm_liliprop.vllm import offline

    def refuse(self):
        raise AssertionError("a finished run built an engine")

    monkeypatch.setattr(offline.OfflineEngine, "__enter__", refuse)
    assert main(_command(tiny_models, tmp_path) + ["--no-summary"]) == 0
    assert "0 to run" in capsys.readouterr().out
    assert pd.read_csv(tmp_path / "results.csv").shape == frame.shape

    assert main(["summarize", str(tmp_path / "results.csv"), "--values", "tau"]) == 0
    summary = capsys.readouterr().out
    assert "### tau" in summary and "### speedup" not in summary


def test_paired_runs_measure_ar_beside_each_system_row(tiny_models, tmp_path, capsys, monkeypatch):
    from vllm_liliprop.vllm import offline

    opened = []
    enter = offline.OfflineEngine.__enter__

    def record(self):
        opened.append("spec" if self.speculative_config else "AR")
        return enter(self)

    monkeypatch.setattr(offline.OfflineEngine, "__enter__", record)
    command = _command(tiny_models, tmp_path)
    command[command.index("--stages"):command.index("--stages") + 2] = []
    command[command.index("--temperatures") + 1] = "0"
    assert main(command + ["--paired", "--no-summary", "--benchmarks", "gsm8k"]) == 0
    runs = pd.read_csv(tmp_path / "results.csv")
    ar, dflash = runs[runs["system"] == "AR"].iloc[0], runs[runs["system"] == "DFlash"].iloc[0]
    # AR's own engine, then a second AR engine kept open and DFlash's beside it.
    assert opened == ["AR", "AR", "spec"]
    assert dflash["num_drafts"] > 0 and dflash["num_draft_tokens"] == 7 * dflash["num_drafts"]
    assert math.isnan(ar["paired_ar_wall_s"]) and ar["speedup"] == 1.0
    assert dflash["paired_ar_output_tokens"] == 32 and dflash["paired_ar_wall_s"] > 0
    assert dflash["paired_ar_wall_s"] != ar["wall_s"]  # its own AR run, not AR's row
    assert dflash["speedup"] == pytest.approx(
        dflash["tokens_per_s"] / (dflash["paired_ar_output_tokens"] / dflash["paired_ar_wall_s"]))
    assert json.loads(dflash["protocol"])["paired"] is True
    from plots.tables import pooled_value

    assert pooled_value(runs[runs["system"] == "DFlash"], "speedup", runs[runs["system"] == "AR"]) == \
        pytest.approx(dflash["speedup"])
    # c = 1: measured prompt by prompt, AR interleaved; the per-prompt file sums to the rows.
    prompts = pd.read_csv(tmp_path / "results.prompts.csv")
    mine = prompts[prompts["system"] == "DFlash"]
    assert list(mine["prompt"]) == [0, 1] and (mine["run_id"] == dflash["run_id"]).all()
    assert mine["output_tokens"].sum() == dflash["output_tokens"] == 32
    assert mine["wall_s"].sum() == pytest.approx(dflash["wall_s"])
    assert mine["num_drafts"].sum() == dflash["num_drafts"]
    assert mine["num_accepted_tokens"].sum() == dflash["num_accepted_tokens"]
    assert mine["paired_ar_wall_s"].sum() == pytest.approx(dflash["paired_ar_wall_s"])
    assert len(prompts[prompts["system"] == "AR"]) == 2 and prompts.loc[prompts["system"] == "AR",
                                                                        "paired_ar_wall_s"].isna().all()
    from plots.io import load_results

    loaded = load_results(tmp_path / "results.csv")
    assert all(isinstance(p, dict) and len(p["tokens"]) == 2 for p in loaded["prompts"])


def test_side_by_side_runs_ar_once_a_prompt_and_counts_each_system_alone(tiny_models, tmp_path,
                                                                          monkeypatch):
    """--side-by-side: AR, DFlash at k = 7 and at k = 2 engines open at once, one AR run per
    prompt the reference of both; each system's counters and outputs are those of the same
    systems measured one at a time (greedy: the same tokens, the same drafts)."""
    from vllm_liliprop.vllm import offline

    opened = []
    enter = offline.OfflineEngine.__enter__

    def record(self):
        opened.append((self.speculative_config or {}).get("num_speculative_tokens", 0))
        return enter(self)

    monkeypatch.setattr(offline.OfflineEngine, "__enter__", record)
    command = _command(tiny_models, tmp_path)
    systems = tmp_path / "three_systems.json"
    dflash = {"method": "dflash", "model": "${draft}", "num_speculative_tokens": 7}
    systems.write_text(json.dumps({"AR": {}, "DFlash": {"speculative_config": dflash},
                                   "DFlash-k2": {"speculative_config": {**dflash, "num_speculative_tokens": 2}}}))
    command[command.index("--systems") + 1] = str(systems)
    command[command.index("--stages") + 1] = "DFlash-k2"
    command[command.index("--temperatures") + 1] = "0"
    together, alone = tmp_path / "together.csv", tmp_path / "alone.csv"
    command[command.index("--results") + 1] = str(together)
    assert main(command + ["--paired", "--side-by-side", "--no-summary"]) == 0
    assert opened == [0, 7, 2]  # one engine each, all open together, stages on the same engines
    command[command.index("--results") + 1] = str(alone)
    assert main(command + ["--paired", "--no-summary"]) == 0
    keys = ["system", "benchmark", "kind", "stage"]
    side, apart = (pd.read_csv(f).sort_values(keys).reset_index(drop=True) for f in (together, alone))
    runs = side[side["kind"] == "run"]
    assert len(runs) == 6 and set(side.loc[side["kind"] == "stage", "system"]) == {"DFlash-k2"}
    for column in ("output_tokens", "num_drafts", "num_draft_tokens", "num_accepted_tokens", "output_hashes"):
        assert list(runs[column]) == list(apart.loc[apart["kind"] == "run", column]), column
    k7, k2 = runs[runs["system"] == "DFlash"], runs[runs["system"] == "DFlash-k2"]
    assert (k7["num_draft_tokens"] == 7 * k7["num_drafts"]).all()
    assert (k2["num_draft_tokens"] == 2 * k2["num_drafts"]).all() and (k2["num_drafts"] > 0).all()
    # One AR run per prompt: both systems' references are AR's row, run for run.
    ar = runs[runs["system"] == "AR"].set_index("benchmark")
    for rows in (k7, k2):
        for _, row in rows.iterrows():
            assert row["paired_ar_wall_s"] == pytest.approx(ar.loc[row["benchmark"], "wall_s"])
            assert row["speedup"] == pytest.approx(row["tokens_per_s"] / ar.loc[row["benchmark"], "tokens_per_s"])
    assert json.loads(k7.iloc[0]["protocol"])["side_by_side"] is True
    prompts = pd.read_csv(tmp_path / "together.prompts.csv")
    assert len(prompts) == 3 * 2 * 2 and prompts.loc[prompts["system"] == "AR", "paired_ar_wall_s"].isna().all()


def test_side_by_side_needs_paired(tiny_models, tmp_path, capsys):
    assert main(_command(tiny_models, tmp_path) + ["--side-by-side"]) == 2
    assert "--side-by-side takes its speedups from AR's runs beside each system's: add --paired" in \
        capsys.readouterr().err
    assert not (tmp_path / "results.csv").exists()


def test_paired_batches_at_c2_alternate_their_order_and_pair_each_row(tiny_models, tmp_path, monkeypatch):
    from eval import runner

    order, in_reference = [], []
    measure, warm_and_run = runner._PairedBaseline.measure, runner.Campaign._warm_and_run

    def reference(self, m, job_rates):
        order.append((m.seed, "AR"))
        in_reference.append(True)
        try:
            return measure(self, m, job_rates)  # runs AR through Campaign._warm_and_run too
        finally:
            in_reference.pop()

    def system(self, engine, render, m, offline, stages=False):
        if m.system.name == "DFlash" and not in_reference:
            order.append((m.seed, "DFlash"))
        return warm_and_run(self, engine, render, m, offline, stages)

    monkeypatch.setattr(runner._PairedBaseline, "measure", reference)
    monkeypatch.setattr(runner.Campaign, "_warm_and_run", system)
    command = _command(tiny_models, tmp_path)
    command[command.index("--stages"):command.index("--stages") + 2] = []
    command[command.index("--temperatures") + 1] = "1"
    command[command.index("--seeds") + 1] = "42,43"
    assert main(command + ["--paired", "--no-summary", "--benchmarks", "gsm8k", "--concurrency", "2"]) == 0
    # Seed 42 and 43 of the same row run their pair in opposite orders.
    assert sorted(order[0:2]) == [(42, "AR"), (42, "DFlash")] and sorted(order[2:4]) == [(43, "AR"), (43, "DFlash")]
    assert [arm for _, arm in order[0:2]] == [arm for _, arm in order[2:4]][::-1]
    runs = pd.read_csv(tmp_path / "results.csv")
    dflash = runs[runs["system"] == "DFlash"]
    assert len(dflash) == 2 and (dflash["paired_ar_output_tokens"] == 32).all()
    assert (dflash["speedup"] - dflash["tokens_per_s"] / (dflash["paired_ar_output_tokens"]
                                                        / dflash["paired_ar_wall_s"])).abs().max() < 1e-9
