"""The README's main command on the shipped testbed (cut down to two systems and one prompt)."""

import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from eval.schema import ALL_COLUMNS

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]


def test_run_sh_evaluates_the_shipped_testbed_and_writes_plots(tmp_path):
    env = dict(os.environ, LILIPROP_OUT=str(tmp_path))
    proc = subprocess.run(
        ["bash", "run.sh", "--only", "AR,LiLiCorr-greedy", "--limit", "1", "--max-tokens", "16",
         "--no-progress"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = pd.read_csv(tmp_path / "results.csv")
    assert set(ALL_COLUMNS) <= set(results.columns)
    assert set(results["system"]) == {"AR", "LiLiCorr-greedy"}
    lattice = results[results["system"] == "LiLiCorr-greedy"]
    assert (lattice["num_drafts"] > 0).all() and (lattice["tau"] >= 1.0).all()
    assert "### tau" in proc.stdout
    index = (tmp_path / "plots" / "index.md").read_text()
    assert "speedup_bars.png" in index
    assert (tmp_path / "plots" / "speedup_bars.png").stat().st_size > 1000
