"""The draft-rule cost benchmark, python -m eval.head_bench: a quick CPU run end to end."""

import math
import os
import subprocess
import sys

import pandas as pd
import pytest

from eval.head_bench import COLUMNS, DRAFTER_PIECE, NUM_SLOTS, PIECES, PRESETS, BenchConfig

# The pieces the benchmark exists to compare; PIECES may grow, these must stay.
REQUIRED_PIECES = {
    "drafter_forward", "lm_head", "topk_candidates", "topk_candidates/kernels", "lattice_head",
    "greedy_walk", "viterbi_walk", "sampled_walk", "dels_draft/markov", "dels_draft/gru",
    "lattice_dels_terms_markov", "greedy_walk_with_short_head/gru", "domino_head",
    "dspark_markov_head",
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
        assert rows.loc[rows.piece == DRAFTER_PIECE, "ratio_to_drafter"].item() == 1.0


def test_the_timed_draft_step_is_the_drafters_forward():
    """DraftStep runs the drafter's own layers over cached context K/V (what vLLM does): with
    the cache holding the context's K/V it returns what DFlashDrafter.forward returns."""
    import torch
    import torch.nn.functional as F

    from eval.head_bench import DraftStep, build_models
    from training.drafter import rope_cos_sin

    cfg, cpu, batch = PRESETS["quick"], torch.device("cpu"), 2
    models = build_models(cfg, cpu)
    drafter, step = models.drafter, DraftStep(models, cfg, batch, cpu)
    taps = torch.randn(batch, step.context_len, step.new_taps.shape[-1], dtype=step.new_taps.dtype)
    taps[:, -step.num_new:] = step.new_taps
    with torch.inference_mode():
        context = drafter.context_states(taps)
        positions = torch.arange(step.context_len).expand(batch, -1)
        cos, sin = rope_cos_sin(positions, drafter.config.head_dim, drafter.config.rope_theta)
        for layer, (k_cache, v_cache) in zip(drafter.layers, step.caches):
            k_cache[:], v_cache[:] = layer.self_attn.key_value(context, cos, sin)
        hidden, anchor_hidden = step.backbone()
        block = F.embedding(step.block_ids, models.embed_weight)[:, None]
        expected = drafter(block, context, torch.full((batch, 1), step.context_len))[:, 0]
    torch.testing.assert_close(hidden, expected)
    assert torch.equal(anchor_hidden, context[:, -1])


def test_sequential_heads_draft_a_block_at_the_drafters_width():
    """The Domino and DSpark rows time real sequential drafting of the benchmark's block: a GRU
    cell as wide as the drafter and residuals over the whole vocabulary."""
    import torch

    from eval.head_bench import SEQUENTIAL_RANK, DraftStep, build_models, make_pieces

    cfg, cpu = PRESETS["quick"], torch.device("cpu")
    models = build_models(cfg, cpu)
    assert models.domino.config.hidden_size == cfg.hidden_size
    assert models.domino.up.weight.shape == (cfg.vocab_size, SEQUENTIAL_RANK)
    assert models.dspark.markov_w2.weight.shape == (cfg.vocab_size, SEQUENTIAL_RANK)
    with torch.inference_mode():
        pieces = make_pieces(models, DraftStep(models, cfg, 2, cpu))
        for name in ("domino_head", "dspark_markov_head"):
            ids, faulty = pieces[name]()
            assert ids.shape == (2, NUM_SLOTS) and not faulty.any(), name
            assert ids.min() >= 0 and ids.max() < cfg.vocab_size


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
