"""The README's main command: the real target with the drafts shipped in testbed/smollm2, cut down
to two systems, one prompt per benchmark and 16 tokens (the stage decomposition included): a timed
bf16 pass and an fp32 pass whose greedy outputs are compared with plain decoding."""

import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from eval.schema import ALL_COLUMNS

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]


def test_run_sh_evaluates_the_shipped_drafts_and_writes_plots(tmp_path):
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
    paired = lattice[lattice["kind"] == "run"]
    assert (paired["paired_ar_wall_s"] > 0).all()  # every speedup is over AR measured beside it
    runs = results[results["kind"] == "run"]
    assert set(runs["benchmark"]) == {"humaneval", "mtbench", "aime2024", "math500", "aime2025",
                                      "gsm8k", "alpacaeval"}
    assert set(results.loc[results["kind"] == "stage", "system"]) == {"LiLiCorr-greedy"}
    checked = pd.read_csv(tmp_path / "lossless.csv")
    assert set(checked["system"]) == {"AR", "LiLiCorr-greedy"}
    from vllm_liliprop.host import fast_dtype

    # The timed pass runs in the dtype this host is fast in (measured again here: same answer
    # unless the host sits right at the threshold).
    assert {json.loads(f)["dtype"] for f in results["engine_flags"]} == {fast_dtype()}
    assert {json.loads(f)["dtype"] for f in checked["engine_flags"]} == {"float32"}
    assert "greedy output identical to AR (prompts, float32)" in proc.stdout
    # Served by this host kind's measured plan (run.sh: eval run --plans), under its own name.
    assert "[main job] plans: testbed/smollm2/schedule/" in proc.stdout
    assert all("num_speculative_tokens_per_batch_size" in c for c in lattice["system_config"])
    assert "≠" not in proc.stdout.split("greedy output identical to AR")[1]
    assert "### tau" in proc.stdout
    index = (tmp_path / "plots" / "index.md").read_text()
    assert "in `lossless.csv`" in index
    assert "speedup_bars.png" in index
    assert (tmp_path / "plots" / "speedup_bars.png").stat().st_size > 1000
