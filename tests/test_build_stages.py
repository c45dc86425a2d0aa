"""The shared build stages (training/build_stages/) as training.realbed calls them: from paths on disk,
each returning its manifest fragment (the smoke testbed in test_testbed.py calls them with
in-memory inputs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests._training_helpers import record_realbed_stages
from training.build_stages.dels import dels_stage
from training.build_stages.drafts import draft_stage, run_tail, tail_means
from training.build_stages.measure import measure_stage
from training.build_stages.tokenization import tokenize_stage
from training.data import TokenizedDataset

REPO = Path(__file__).resolve().parents[1]


def _train(output_dir, lrs):
    return {"output_dir": str(output_dir), "max_steps": 2, "batch_size": 2, "precision": "fp32", "seed": 0,
            "save_every": 100, "log_every": 1, "keep_checkpoints": 1,
            "optim": {"lr": lrs, "weight_decay": {k: 0.0 for k in lrs}, "warmup_ratio": 0.0}}


def test_tail_means_skip_missing_keys():
    history = [{"loss": 4.0}, {"loss": 2.0, "ce": 1.0}, {"loss": 1.0, "ce": 3.0}]
    assert tail_means(history, ("loss", "ce", "other"), 2) == {"loss": 1.5, "ce": 2.0}
    assert tail_means([], ("loss",), 10) == {}


def test_the_tail_of_a_resumed_run_reads_the_steps_before_it_from_metrics_jsonl(tmp_path):
    from types import SimpleNamespace

    # Steps 1..6 were logged; the checkpoint was at 4, so the resumed run logs 5..6 again.
    lines = [{"step": s, "loss": float(s)} for s in range(1, 7)] + [{"step": s, "loss": 10.0 * s} for s in (5, 6)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    trainer = SimpleNamespace(output_dir=tmp_path, step=6)
    resumed = {"history": [{"step": 5, "loss": 50.0}, {"step": 6, "loss": 60.0}], "trainer": trainer}
    assert run_tail(resumed, ("loss",), 4) == {"loss": (3 + 4 + 50 + 60) / 4}
    finished = {"history": [], "trainer": trainer}  # resumed from the final checkpoint
    assert run_tail(finished, ("loss",), 2) == {"loss": 55.0}
    whole = {"history": [{"step": s, "loss": float(s)} for s in range(1, 7)], "trainer": trainer}
    assert run_tail(whole, ("loss",), 4) == {"loss": 4.5}


@pytest.mark.slow
def test_stages_from_paths_return_their_fragments(tiny_models, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target_dir = tiny_models["target"]
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    conversations = [{"id": str(i), "messages": [
        {"role": "user", "content": f"count from {i}"},
        {"role": "assistant", "content": " ".join(str(i + k) for k in range(30))}]} for i in range(6)]
    data = tmp_path / "data"
    tokenized = tokenize_stage(tokenizer, {"heldout": (conversations[:2], data / "heldout.jsonl"),
                                           "train": (conversations, data / "train.jsonl")}, 256)
    assert list(tokenized) == ["heldout", "train"] and tokenized["train"]["examples"] == 6
    assert tokenized["train"]["supervised_tokens"] == sum(
        sum(m) for m in TokenizedDataset.load(data / "train.jsonl").loss_masks)

    mask = tokenizer.convert_tokens_to_ids("<|mask|>")
    common = {"target": target_dir, "target_dtype": "float32", "data": str(data / "train.jsonl"), "device": "cpu",
              "num_anchors": 4, "export_dtype": "bfloat16"}
    drafter = {"num_hidden_layers": 1, "block_size": 4, "mask_token_id": mask, "target_layer_ids": [1, 3]}
    dflash = draft_stage({**common, "method": "dflash", "drafter": drafter,
                          "train": _train(tmp_path / "runs/dflash", {"drafter": 1e-3})},
                         tmp_path / "drafts/dflash", target_dir, progress=False)
    lilicorr = draft_stage({**common, "method": "lilicorr", "drafter": drafter,
                            "lattice": {"candidate_topk": 4, "hidden_size": 0, "num_layers": 1, "num_heads": 2,
                                        "factor_dim": 16},
                            "train": _train(tmp_path / "runs/lilicorr", {"drafter": 1e-3, "head": 1e-3})},
                           tmp_path / "drafts/lilicorr", target_dir, progress=False)
    for fragment, folder in ((dflash, "dflash"), (lilicorr, "lilicorr")):
        assert fragment["steps"] == 2 and fragment["path"] == str(tmp_path / "drafts" / folder)
        assert set(fragment["train_tail"]) == {"loss", "accept_argmax", "slot_accuracy"}
        assert (tmp_path / "drafts" / folder / "tokenizer_config.json").is_file()
        json.dumps(fragment)

    dels = {}
    heads = {"gru": {"kind": "gru", "hidden_size": 16, "rank": 8}, "markov": {"kind": "markov", "rank": 8}}
    for kind, head in heads.items():
        folder = tmp_path / "drafts/dflash" / ("dels" if kind == "gru" else "dels_markov")
        fragment = dels_stage({"method": "dels", "target": target_dir, "data": str(data / "train.jsonl"),
                               "device": "cpu", "head": head, "block_size": 4, "num_anchors": 4,
                               "train": _train(tmp_path / f"runs/dels_{kind}", {"head": 1e-3})},
                              folder, torch.bfloat16, progress=False)
        assert fragment["path"] == str(folder) and fragment["steps"] == 2 and "ce" in fragment["train_tail"]
        assert json.loads((folder / "config.json").read_text())["kind"] == kind
        dels[kind] = folder

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    heldout = TokenizedDataset.load(data / "heldout.jsonl")
    measured = measure_stage(target, heldout, tmp_path / "drafts/dflash", tmp_path / "drafts/lilicorr", 4, 0,
                             dels_dirs=dels, block_size=4)
    assert measured["heldout_examples"] == 2 and measured["anchors_per_example"] == 4
    assert set(measured["heldout_tau"]) == {"dflash", "lilicorr_argmax", "lilicorr_greedy_walk"}
    assert all(1.0 <= tau <= 4 for tau in measured["heldout_tau"].values())
    assert set(measured["dels_heldout_ce"]) == {"gru", "markov"}
    # The headroom of both drafts, on the same blocks as their taus.
    headroom = measured["headroom"]
    assert set(headroom) == {"dflash", "lilicorr"} and "walk_tau" in headroom["lilicorr"]
    assert headroom["dflash"]["argmax_tau"] == pytest.approx(measured["heldout_tau"]["dflash"], abs=2e-4)
    assert headroom["lilicorr"]["walk_tau"] == pytest.approx(measured["heldout_tau"]["lilicorr_greedy_walk"], abs=2e-4)
    # Without DeLS folders the fragment is the one training.realbed records.
    assert "dels_heldout_ce" not in measure_stage(target, heldout, tmp_path / "drafts/dflash",
                                                  tmp_path / "drafts/lilicorr", 4, 0)


def test_realbed_runs_the_same_stages_in_order(tmp_path, monkeypatch):
    import training.realbed as realbed
    from training.recipe import load_recipe

    names = []

    def record(out, name, fn, log=print):
        names.append(name)
        return {"weights_sha256": "0" * 64}

    monkeypatch.setattr(realbed, "_eval_cli", lambda *args: str(tmp_path / "target") + "\n")
    monkeypatch.setattr(realbed, "run_stage", record)
    (tmp_path / "out").mkdir()
    manifest = realbed.build(load_recipe("smollm2/build"), tmp_path / "out", log=lambda _: None)
    assert names == ["target", "benchmarks", "prompts", "decontaminate", "split", "regenerate", "tokenize",
                     "dflash", "dflash_round2", "lilicorr", "dspark", "domino", "dels_gru", "dels_markov",
                     "dels_fusion_markov", "measure", "measure_baselines", "ablation_no_distractor", "ablation_margin",
                     "ablation_eq6_blocks", "ablation_k4", "ablation_k16", "ablation_block16"]
    assert manifest["target_weights_sha256"] == "0" * 64 and set(manifest["versions"]) >= {"torch", "vllm"}


def test_realbed_until_stops_after_the_named_stage(tmp_path, monkeypatch):
    import training.realbed as realbed
    from training.recipe import load_recipe

    calls = record_realbed_stages(realbed, tmp_path, monkeypatch)
    with pytest.raises(realbed.StoppedAfter):
        realbed.build(load_recipe("smollm2/build"), tmp_path / "out", log=lambda _: None, until="tokenize")
    assert list(calls)[-1] == "tokenize" and "dflash" not in calls
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_realbed_adopts_a_finished_first_round(tmp_path, monkeypatch):
    """--adopt dflash=DIR: the first DFlash round is a copy of DIR, recorded with its weights'
    sha256 and the parent build's stage record; the second round starts from that copy."""
    import hashlib

    import training.realbed as realbed
    from training.recipe import load_recipe

    source = tmp_path / "shipped"
    source.mkdir()
    (source / "config.json").write_text("{}")
    (source / "model.safetensors").write_bytes(b"weights")
    parent = tmp_path / "parent.json"
    parent.write_text(json.dumps({"stages": {"dflash": {"steps": 1500}}}))
    calls = record_realbed_stages(realbed, tmp_path, monkeypatch)
    realbed.build(load_recipe("smollm2/build"), tmp_path / "out", log=lambda _: None,
                  adopt={"dflash": str(source)}, parent_manifest=parent)
    fragment = calls["dflash"]()
    first_round = tmp_path / "out" / "drafts" / "dflash_round1"
    assert fragment["path"] == str(first_round) and (first_round / "model.safetensors").read_bytes() == b"weights"
    assert fragment["sha256"] == {"model.safetensors": hashlib.sha256(b"weights").hexdigest()}
    assert fragment["parent_build"] == {"steps": 1500}
    with pytest.raises(ValueError, match="only the first DFlash round"):
        realbed.build(load_recipe("smollm2/build"), tmp_path / "out", adopt={"lilicorr": str(source)})
    with pytest.raises(ValueError, match="no config.json"):
        realbed.build(load_recipe("smollm2/build"), tmp_path / "out", adopt={"dflash": str(tmp_path)})


def test_realbed_measure_records_the_headroom_of_both_dflash_rounds(tmp_path, monkeypatch):
    """The measure stage's fragment keeps its keys and adds "headroom", the first DFlash round's
    too (measured on the same held-out set), rounded for the manifest."""
    import transformers

    import training.realbed as realbed
    from training.recipe import load_recipe

    calls = record_realbed_stages(realbed, tmp_path, monkeypatch)
    realbed.build(load_recipe("smollm2/build"), tmp_path / "out", log=lambda _: None)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: torch.nn.Linear(1, 1))
    monkeypatch.setattr(realbed.TokenizedDataset, "load", lambda path: "heldout")
    stage = {"heldout_examples": 1, "heldout_tau": {"dflash": 1.5}, "headroom": {"dflash": {}, "lilicorr": {}}}
    monkeypatch.setattr(realbed, "measure_stage", lambda *a, **k: json.loads(json.dumps(stage)))
    round1 = {"accept_argmax": 0.4, "headroom": {"argmax_tau": 1.400001, "slot_acceptance": [0.123456, None]}}
    seen = []
    monkeypatch.setattr(realbed, "drafter_acceptance", lambda folder, *a: seen.append((folder, a[2])) or round1)
    fragment = calls["measure"]()
    assert seen == [(tmp_path / "out" / "drafts" / "dflash_round1", "heldout")]
    assert fragment["heldout_examples"] == 1 and fragment["heldout_tau"] == {"dflash": 1.5, "dflash_round1": 1.4}
    assert fragment["headroom"] == {"dflash": {}, "lilicorr": {},
                                    "dflash_round1": {"argmax_tau": 1.4, "slot_acceptance": [0.1235, None]}}


def test_realbed_seeds_its_data_from_a_snapshot(tmp_path, monkeypatch):
    import training.realbed as realbed
    from training.build_stages.snapshot import SNAPSHOT_FILES, write_snapshot
    from training.recipe import load_recipe

    recipe = load_recipe("smollm2/build")
    source = tmp_path / "source"
    (source / "data").mkdir(parents=True)
    for name in SNAPSHOT_FILES:
        (source / "data" / name).write_text('{"id": "x"}\n')
    (source / "stages").mkdir()
    for name in ("prompts", "regenerate"):
        (source / "stages" / f"{name}.json").write_text("{}")
    write_snapshot(source, tmp_path / "snap", recipe, "0" * 64)
    record_realbed_stages(realbed, tmp_path, monkeypatch)
    realbed.build(recipe, tmp_path / "out", log=lambda _: None, data_snapshot=tmp_path / "snap")
    assert all((tmp_path / "out" / "data" / name).read_text() == '{"id": "x"}\n' for name in SNAPSHOT_FILES)


def test_an_ablation_only_build_leaves_out_the_stages_its_recipes_omit(tmp_path, monkeypatch):
    import training.realbed as realbed
    from training.recipe import apply_overrides, load_recipe

    recipe = apply_overrides(load_recipe("smollm2/build"), [
        'recipes={"dflash": "smollm2/dflash", "lilicorr": "smollm2/lilicorr"}', 'ablations={"k4": {}}'])
    calls = record_realbed_stages(realbed, tmp_path, monkeypatch)
    realbed.build(recipe, tmp_path / "out", log=lambda _: None)
    assert list(calls)[7:] == ["dflash", "lilicorr", "measure", "ablation_k4"]


def test_a_builds_heldout_taus_become_results_rows_the_ablation_table_reads(tmp_path):
    """training/build_stages/heldout_table.py on the shipped build's manifest plus one ablation
    stage: every tau lands under its served system's name, and plots' ablation table compares them."""
    from plots.ablations import ablation_table, load_ablation_spec
    from plots.io import load_results
    from plots.tables import render_markdown
    from training.build_stages.heldout_table import heldout_tau_table, write_heldout_tau_table

    manifest = json.loads((REPO / "testbed" / "smollm2" / "manifest.json").read_text())
    measured = manifest["stages"]["measure"]["heldout_tau"]
    manifest["stages"]["ablation_margin"] = {"overrides": {"loss.margin_blend": 0.5},
                                             "heldout_tau": {"lilicorr_argmax": 1.5, "lilicorr_greedy_walk": 1.53}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    out = write_heldout_tau_table(tmp_path / "manifest.json", tmp_path / "heldout_tau.csv")
    rows = load_results(out)
    tau = dict(zip(rows["system"], rows["tau"]))
    assert tau["DFlash"] == measured["dflash"] and tau["LiLiCorr-greedy"] == measured["lilicorr_greedy_walk"]
    assert tau["DSpark"] == manifest["stages"]["measure_baselines"]["heldout_tau"]["dspark"]
    assert tau["LiLiCorr-greedy [margin]"] == 1.53
    margin = rows[rows["system"] == "LiLiCorr-greedy [margin]"].iloc[0]
    assert json.loads(margin["overrides"]) == {"loss.margin_blend": 0.5} and margin["build_stage"] == "ablation_margin"
    table = render_markdown(ablation_table(rows, load_ablation_spec(REPO / "testbed" / "smollm2" / "trained_ablations.json")))
    change = 100 * (1.53 / measured["lilicorr_greedy_walk"] - 1)
    assert f"| {measured['lilicorr_greedy_walk']:.3f} | 1.530 | {change:+.2f}% |" in table
    assert "not measured (no rows in the results): LiLiCorr-greedy [eq6_blocks]" in table
    # A build before its measure stage has no rows, and no file is written.
    manifest["stages"] = {"target": {}}
    assert heldout_tau_table(manifest).empty
    (tmp_path / "m2.json").write_text(json.dumps(manifest))
    assert write_heldout_tau_table(tmp_path / "m2.json", tmp_path / "none.csv") is None
    manifest["stages"] = {"measure": {"heldout_tau": {"mystery": 1.2}}}
    with pytest.raises(ValueError, match="'mystery' has no system name"):
        heldout_tau_table(manifest)
