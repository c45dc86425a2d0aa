"""training.testbed: corpus split and tiers (fast), and the smoke preset end to end through vLLM."""

import json
import math
import shlex

import pandas as pd
import pytest
from safetensors import safe_open

from training.testbed import (
    code_windows,
    entropy_tiers,
    function_requests,
    main,
    split_corpus,
    systems_config,
)

SYSTEMS = ["AR", "DFlash", "DeLS-GRU", "DeLS-Markov", "LiLiCorr-greedy", "LiLiCorr-viterbi", "LiLiCorr+DeLS"]


def test_split_is_deterministic_disjoint_and_by_name():
    first = split_corpus(20, 1000, 1000)
    second = split_corpus(20, 1000, 1000)
    assert first == second
    train, heldout = {p.name for p in first["train"]}, {p.name for p in first["heldout"]}
    assert train and heldout and not train & heldout
    # Roughly the requested share, and a wider held-out share only adds files.
    share = len(heldout) / (len(train) + len(heldout))
    assert 0.08 < share < 0.35
    assert heldout <= {p.name for p in split_corpus(40, 1000, 1000)["heldout"]}
    with pytest.raises(ValueError, match="heldout_percent"):
        split_corpus(0, 10, 10)


def test_code_windows_and_function_requests():
    text = "".join(f"x{i} = {i}\n" for i in range(10))
    windows = code_windows(text, prefix_lines=3, continuation_lines=2, stride=4)
    assert windows[0] == ("x0 = 0\nx1 = 1\nx2 = 2\n", "x3 = 3\nx4 = 4\n")
    assert windows[1][0].startswith("x4 = 4\n") and len(windows) == 2
    source = 'def add(a, b=1):\n    """Add two numbers.\n\n    More text."""\n    return a + b\n\ndef bare():\n    pass\n'
    (request, answer), = function_requests(source)
    assert request == "Write the Python function `add(a, b=1)`: Add two numbers."
    assert answer.startswith("def add(a, b=1):") and answer.endswith("return a + b")
    assert function_requests("def broken(:\n") == []


def test_entropy_tiers_are_ordered_and_reject_too_few():
    values = [0.5, 3.0, float("nan"), 1.0, 2.0, 0.1, 2.5, 1.5]
    tiers = entropy_tiers(values, per_tier=2)
    assert tiers == {"low": [0, 5], "mixed": [3, 7], "high": [1, 6]}
    assert max(values[i] for i in tiers["low"]) < min(values[i] for i in tiers["mixed"])
    with pytest.raises(ValueError, match="entropy tiers"):
        entropy_tiers([1.0, 2.0], per_tier=1)


def test_systems_file_is_accepted_by_eval(tmp_path):
    from eval.systems import load_systems, select_systems

    path = tmp_path / "systems.json"
    path.write_text(json.dumps(systems_config(tmp_path, 7)))
    systems = select_systems(load_systems(str(path), {}), None)
    assert [s.name for s in systems] == SYSTEMS
    assert [s.uses_dels for s in systems] == [False, False, True, True, False, False, True]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("testbed") / "smoke"
    assert main(["--preset", "smoke", "--out", str(out)]) == 0
    return out


@pytest.mark.slow
@pytest.mark.vllm
def test_smoke_preset_writes_artifacts_and_manifest(smoke):
    manifest = json.loads((smoke / "manifest.json").read_text())
    assert manifest["command"] == shlex.join(["python", "-m", "training.testbed", "--preset", "smoke", "--out", str(smoke)])
    assert manifest["recipe"]["method"] == "testbed" and manifest["seeds"]["recipe"] == 0
    assert manifest["versions"]["vllm"] and manifest["versions"]["torch"]
    metrics, sizes = manifest["metrics"], manifest["sizes"]
    # The trained target beats a uniform guess over its vocabulary on held-out files.
    assert 0 < metrics["target_heldout_loss"] < math.log(sizes["vocab_size"])
    for key in ("heldout_tau_dflash", "heldout_tau_lilicorr_argmax", "heldout_tau_lilicorr_greedy_walk"):
        assert 1.0 <= metrics[key] <= manifest["recipe"]["drafter"]["block_size"]
    for key in ("dflash_train_loss", "lilicorr_train_loss", "dels_gru_train_ce", "dels_markov_train_ce",
                "dels_gru_heldout_ce", "dels_markov_heldout_ce"):
        assert math.isfinite(metrics[key]) and metrics[key] > 0
    tier_means = [metrics["entropy_tier_mean"][t] for t in ("low", "mixed", "high")]
    assert tier_means == sorted(tier_means)
    assert sizes["train_examples"] > 0 and sizes["train_supervised_tokens"] > 0
    split = json.loads((smoke / "data/split.json").read_text())
    assert not set(split["train"]) & set(split["heldout"])

    for folder in ("target", "drafts/dflash", "drafts/lilicorr"):
        config = json.loads((smoke / folder / "config.json").read_text())
        assert config["dtype"] == "float16" or config.get("torch_dtype") == "float16"
    assert json.loads((smoke / "drafts/lilicorr/config.json").read_text())["architectures"] == ["LiLiCorrDraftModel"]
    kinds = {json.loads((smoke / "drafts/dflash" / d / "config.json").read_text())["kind"]
             for d in ("dels", "dels_markov")}
    assert kinds == {"gru", "markov"}
    for folder in ("target", "drafts/dflash", "drafts/lilicorr", "drafts/dflash/dels", "drafts/dflash/dels_markov"):
        with safe_open(str(smoke / folder / "model.safetensors"), "pt") as f:
            dtypes = {name: f.get_slice(name).get_dtype() for name in f.keys()}
        # fp16 weights; only the DeLS unigram prior is kept in fp32.
        assert {d for name, d in dtypes.items() if name != "prior.log_probs"} == {"F16"}, folder

    suites = {p.stem: [json.loads(line) for line in p.open()] for p in (smoke / "eval/testbed").glob("*.jsonl")}
    assert set(suites) == {"code", "chat", "entropy"}
    held_out_files = {f"heldout-{k}" for k in ("code", "chat")}
    for rows in suites.values():
        assert rows and all(isinstance(r["turns"], list) and r["turns"][0] for r in rows)
        assert all(r["id"].rsplit("-", 1)[0] in held_out_files for r in rows)
    assert {r["category"] for r in suites["entropy"]} == {"low", "mixed", "high"}
    assert list(json.loads((smoke / "systems.json").read_text())) == SYSTEMS


@pytest.mark.slow
@pytest.mark.vllm
def test_smoke_artifacts_serve_in_vllm_through_eval(smoke):
    from eval.cli import main as eval_main

    results = smoke / "results.csv"
    code = eval_main([
        "run", "--target", str(smoke / "target"), "--systems", str(smoke / "systems.json"),
        "--only", "DeLS-Markov,LiLiCorr+DeLS", "--benchmarks", "testbed-code,testbed-entropy",
        "--data-dir", str(smoke / "eval"), "--limit", "1", "--temperatures", "0", "--max-tokens", "8",
        "--ignore-eos", "--warmup-tokens", "2", "--no-progress", "--no-summary",
        "--engine-flags", json.dumps({"dtype": "float32", "max_model_len": 512, "enforce_eager": True}),
        "--results", str(results),
    ])
    assert code == 0
    frame = pd.read_csv(results)
    runs = frame[frame["kind"] == "run"]
    # One row per system x (code, entropy low / mixed / high).
    assert sorted(set(zip(runs["system"], runs["benchmark"], runs["category"].fillna("")))) == sorted(
        (s, b, c) for s in ("DeLS-Markov", "LiLiCorr+DeLS")
        for b, c in [("testbed-code", "")] + [("testbed-entropy", t) for t in ("high", "low", "mixed")])
    assert (runs["num_drafts"] > 0).all() and (runs["output_tokens"] == 8).all()
    assert (runs["num_draft_tokens"] == 7 * runs["num_drafts"]).all()
