"""`python -m eval grid`: each system's pooled paired speedup per (T, c) cell, current plans only."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from eval.cli import main as eval_main
from eval.grid import absolute_paths, config_key, current_configs, current_weights, grid_cells, grid_markdown
from eval.summary import pooled_results
from plots.tables import pooled_value

GRID = "testbed/smollm2/schedule/avx2/results_grid_c32_t0/results.csv"  # one run at c = 32, T = 0
AVX2_PLANS = "testbed/smollm2/schedule/avx2/systems.json"
SYSTEMS = ("DSpark-scheduled", "Domino-scheduled", "DFlash-scheduled")


def _served(system: str) -> dict:
    rows = pd.read_csv(GRID, keep_default_na=False)
    return json.loads(rows.loc[rows["system"] == system, "system_config"].iloc[0])


@pytest.fixture
def systems_file(tmp_path):
    """A systems file whose entries are what the grid's rows served, but DFlash's plan changed."""
    entries = {"AR": {}}
    for name in SYSTEMS:
        served = _served(name)
        spec = dict(served["speculative_config"], model="${drafts}/elsewhere")
        entries[name] = {"description": name, "speculative_config": spec, "liliprop": served["liliprop"]}
    entries["DFlash-scheduled"]["speculative_config"]["num_speculative_tokens_per_batch_size"] = [[1, 32, 0]]
    path = tmp_path / "systems.json"
    path.write_text(json.dumps(entries))
    return path


@pytest.fixture
def second_run(tmp_path):
    rows = pd.read_csv(GRID, keep_default_na=False)
    rows["run_id"] = rows["run_id"] + "-again"
    rows["wall_s"] = rows["wall_s"] * 1.25  # every system 20% slower than in the first run
    path = tmp_path / "again.csv"
    rows.to_csv(path, index=False)
    return path


def test_a_config_is_what_was_served_whatever_the_drafts_folder():
    served = _served("DSpark-scheduled")
    moved = dict(served["speculative_config"], model="/tmp/clone/drafts/dspark")
    assert config_key(moved, served["liliprop"]) == config_key(served["speculative_config"], served["liliprop"])
    other = dict(moved, num_speculative_tokens_per_batch_size=[[1, 32, 0]])
    assert config_key(other, served["liliprop"]) != config_key(moved, served["liliprop"])


def test_cells_pool_every_run_of_the_current_plan_and_leave_older_plans_out(systems_file, second_run):
    configs = current_configs(systems_file)
    once, stale_once = grid_cells(pooled_results(GRID), configs)
    twice, stale_twice = grid_cells(pooled_results([GRID, second_run]), configs)
    assert set(once["system"]) == {"DSpark-scheduled", "Domino-scheduled"}  # DFlash ran another plan
    assert stale_once == 3 and stale_twice == 6  # its three benchmark rows in each run
    assert list(once["runs"]) == [1, 1] and list(twice["runs"]) == [2, 2]
    rows = pooled_results([GRID, second_run])
    dspark = rows[rows["system"] == "DSpark-scheduled"]
    cell = twice.set_index("system").loc["DSpark-scheduled"]
    assert cell["speedup"] == pytest.approx(pooled_value(dspark, "speedup", None))
    assert cell["speedup"] < once.set_index("system").loc["DSpark-scheduled", "speedup"]
    assert cell["low"] <= cell["speedup"] <= cell["high"]
    again, _ = grid_cells(pooled_results([GRID, second_run, GRID]), configs)  # a file given twice
    assert list(again["runs"]) == [2, 2] and again["speedup"].tolist() == pytest.approx(twice["speedup"].tolist())


def test_the_matrix_marks_cells_under_the_floor_and_unmeasured_ones():
    cells = pd.DataFrame([
        {"system": "A", "temperature": 0.0, "concurrency": 1, "runs": 2, "speedup": 1.10, "low": 1.0, "high": 1.2},
        {"system": "A", "temperature": 1.0, "concurrency": 4, "runs": 1, "speedup": 0.95, "low": 0.9, "high": 0.99},
        {"system": "B", "temperature": 0.0, "concurrency": 1, "runs": 3, "speedup": 0.97, "low": 0.95, "high": 0.99},
    ])
    text = grid_markdown(cells, floor=0.97)
    lines = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert "| T = 0, c = 1 | T = 1, c = 4 |" in lines["system"]
    assert "1.10x [1.00, 1.20] (2)" in lines["A"] and "**0.95x [0.90, 0.99] (1)**" in lines["A"]
    assert lines["B"].endswith("| 0.97x [0.95, 0.99] (3) | — |")
    assert "2 of 3 measured cells at 0.97x or more" in text


def test_the_command_prints_the_grid(systems_file, second_run, capsys):
    assert eval_main(["grid", GRID, str(second_run), "--systems", str(systems_file),
                      "--only-suffix=-scheduled"]) == 0
    out = capsys.readouterr().out
    assert "| DSpark-scheduled | " in out and "DFlash-scheduled" not in out.split("row(s) left out")[0]
    assert "6 row(s) left out" in out


def test_a_path_among_the_options_matches_through_a_variable_or_a_clone():
    written = {"rule": "lattice+dels", "dels_path": "${drafts}/dflash/dels", "walk": "greedy"}
    served = dict(written, dels_path="/tmp/clone/testbed/smollm2/round3/drafts/dflash/dels")
    assert config_key({}, written) == config_key({}, served)
    assert config_key({}, written) != config_key({}, dict(served, dels_path="/x/drafts/dspark/dels"))


def _hash(system: str) -> str:
    rows = pd.read_csv(GRID, dtype=str, keep_default_na=False)
    return rows.loc[rows["system"] == system, "checkpoint_hash"].iloc[0]


def test_rows_of_other_draft_weights_are_left_out(systems_file):
    """A plan can outlive its draft: rows that served weights other than today's do not count."""
    weights = {"DSpark-scheduled": _hash("DSpark-scheduled"), "Domino-scheduled": "0" * 16,
               "DFlash-scheduled": _hash("DFlash-scheduled")}
    cells, stale = grid_cells(pooled_results(GRID), current_configs(systems_file), weights)
    assert list(cells["system"]) == ["DSpark-scheduled"]
    assert stale == 6  # DFlash's three rows (another plan), Domino's three (other weights)


def test_current_weights_hash_the_drafts_a_variable_names_now(tmp_path):
    shipped = current_weights(AVX2_PLANS, {"drafts": "testbed/smollm2/round3/drafts"}, ["DSpark-scheduled"])
    assert shipped == {"DSpark-scheduled": _hash("DSpark-scheduled")}  # the draft the grid's rows served
    retrained = tmp_path / "drafts" / "dspark"
    retrained.mkdir(parents=True)
    (retrained / "config.json").write_text("{}")
    moved = current_weights(AVX2_PLANS, {"drafts": str(tmp_path / "drafts")}, ["DSpark-scheduled"])
    assert moved["DSpark-scheduled"] != shipped["DSpark-scheduled"]


def test_the_command_with_variables_counts_other_weights_among_the_left_out(systems_file, tmp_path, capsys):
    entries = json.loads(systems_file.read_text())
    entries["DSpark-scheduled"]["speculative_config"]["model"] = "${drafts}/dspark"
    systems_file.write_text(json.dumps(entries))
    drafts = tmp_path / "drafts"
    (drafts / "elsewhere").mkdir(parents=True)
    (drafts / "elsewhere" / "config.json").write_text("{}")  # a draft none of the rows served
    (drafts / "dspark").symlink_to(Path("testbed/smollm2/round3/drafts/dspark").resolve())
    assert eval_main(["grid", GRID, "--systems", str(systems_file), "--only-suffix=-scheduled",
                      "--var", f"drafts={drafts}"]) == 0
    out = capsys.readouterr().out
    assert "| DSpark-scheduled | " in out and "| Domino-scheduled | " not in out
    assert "6 row(s) left out" in out and "configuration or draft weights" in out


def test_a_relative_drafts_folder_hashes_a_dels_draft_as_its_runs_did():
    """Runs pass ${drafts} absolute, and an outside DeLS folder counts in the hash only then."""
    relative = {"drafts": "testbed/smollm2/round3/drafts"}
    served = current_weights(AVX2_PLANS, {"drafts": str(Path(relative["drafts"]).resolve())}, ["LiLiCorr+DeLS-scheduled"])
    assert current_weights(AVX2_PLANS, absolute_paths(relative), ["LiLiCorr+DeLS-scheduled"]) == served
    assert current_weights(AVX2_PLANS, relative, ["LiLiCorr+DeLS-scheduled"]) != served
    assert absolute_paths({"x": "no/such/folder", "y": ""}) == {"x": "no/such/folder", "y": ""}
