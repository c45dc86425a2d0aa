"""`python -m eval summarize A B --only ...`: repeated runs of a noisy cell pooled into one table."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from eval.cli import main as eval_main
from eval.summary import pooled_results, summary_text

GRID = "testbed/smollm2/schedule/avx2/results_grid_c32_t0/results.csv"  # one run, 11 systems


def _speedup_cell(text: str, benchmark: str, column: int) -> str:
    table = text.split("### speedup")[1].split("###")[0]
    row = next(line for line in table.splitlines() if line.startswith(f"| {benchmark} "))
    return row.split("|")[column + 1].strip()


@pytest.fixture
def two_runs(tmp_path):
    first = pd.read_csv(GRID, keep_default_na=False)
    second = first.copy()
    dspark = second["system"] == "DSpark-scheduled"
    second.loc[dspark, "speedup"] = second.loc[dspark, "speedup"] * 0.9
    second["run_id"] = second["run_id"] + "-again"
    path = tmp_path / "again.csv"
    second.to_csv(path, index=False)
    return GRID, path, first.loc[first["system"] == "DSpark-scheduled"].set_index("benchmark")["speedup"]


def test_pooled_runs_average_each_cell_and_give_it_an_interval(two_runs):
    first, second, speedups = two_runs
    alone = summary_text(first, only=["AR", "DSpark-scheduled"])
    pooled = summary_text([first, second], only=["AR", "DSpark-scheduled"])
    assert "(n=1, no interval)" in _speedup_cell(alone, "mtbench", 2)
    cell = _speedup_cell(pooled, "mtbench", 2)
    mean = float(re.match(r"\**([0-9.]+)×", cell).group(1))
    assert mean == pytest.approx(speedups["mtbench"] * 0.95, abs=0.006)
    assert re.search(r"\[[0-9.]+, [0-9.]+\]", cell), cell
    header = pooled.split("### speedup")[1].splitlines()[2]
    assert "DFlash-scheduled" not in header and "DSpark-scheduled" in header


def test_only_keeps_the_named_systems_and_refuses_an_unknown_one(two_runs):
    first, second, _ = two_runs
    rows = pooled_results([first, second], only=["AR", "DSpark-scheduled"])
    assert set(rows["system"]) == {"AR", "DSpark-scheduled"}
    assert rows["run_id"].nunique() == 2
    with pytest.raises(ValueError, match="--only names Nope, which no file has"):
        pooled_results(first, only=["AR", "Nope"])


def test_the_command_pools_the_files_it_is_given(two_runs, capsys):
    first, second, _ = two_runs
    assert eval_main(["summarize", str(first), str(second), "--only", "AR,DSpark-scheduled"]) == 0
    out = capsys.readouterr().out
    assert "(n=1, no interval)" not in _speedup_cell(out, "gsm8k (100/1319)", 2)
