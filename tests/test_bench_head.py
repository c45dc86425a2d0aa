"""The draft-rule cost benchmark, python -m eval.head_bench: a quick CPU run end to end."""

import math
import os
import subprocess
import sys

import pandas as pd
import pytest

from eval.head_bench import COLUMNS, DRAFTER_PIECE, PIECES, PRESETS, BenchConfig

# The pieces the benchmark exists to compare; PIECES may grow, these must stay.
REQUIRED_PIECES = {
    "drafter_forward", "lm_head", "topk_candidates", "topk_candidates/kernels", "lattice_head",
    "greedy_walk", "viterbi_walk", "sampled_walk", "dels_draft/markov", "dels_draft/gru",
    "lattice_dels_terms_markov", "greedy_walk_with_short_head/gru",
}


def _run(args, timeout=120):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


@pytest.mark.slow
def test_quick_run_times_every_piece_relative_to_the_drafter(tmp_path):
    csv = tmp_path / "head.csv"
    # -X importtime lists every imported module on stderr: the benchmark is plain torch.
    bench = ["-m", "eval.head_bench", "--quick", "--csv", str(csv)]
    done = _run(["-X", "importtime", *bench])
    assert done.returncode == 0, done.stderr[-3000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert "torch" in imported
    assert not {m for m in imported if m == "vllm" or m.startswith("vllm.")}
    assert "V=2048 H=128 K=8 S=15" in done.stdout
    assert "NOTE: V = 2048 on CPU" in done.stdout

    table = pd.read_csv(csv)
    assert list(table.columns) == COLUMNS
    assert REQUIRED_PIECES <= set(PIECES)
    batches = list(PRESETS["quick"].batches)
    assert sorted(table.batch.unique()) == batches
    assert (table.device == "cpu").all()
    for batch in batches:
        rows = table[table.batch == batch]
        assert list(rows.piece) == list(PIECES)
        assert all(math.isfinite(ms) and ms > 0 for ms in rows.median_ms)
        drafter_ms = rows.loc[rows.piece == DRAFTER_PIECE, "median_ms"].item()
        for ms, ratio in zip(rows.median_ms, rows.ratio_to_drafter):
            assert ratio == pytest.approx(ms / drafter_ms, rel=1e-12)


@pytest.mark.parametrize(
    "field, value",
    [("hidden_size", 100), ("batches", (1, 0)), ("vocab_size", 4), ("context_len", 8),
     ("repeats", 0), ("dtype", "int8")],
)
def test_bad_config_names_the_field(field, value):
    fields = {**PRESETS["quick"].__dict__, field: value}
    with pytest.raises(ValueError, match=field):
        BenchConfig(**fields)


def test_cli_reports_bad_sizes_as_usage_errors(capsys):
    from eval.head_bench import main

    with pytest.raises(SystemExit) as exited:
        main(["--quick", "--hidden", "100"])
    assert exited.value.code == 2
    assert "hidden_size = 100" in capsys.readouterr().err
