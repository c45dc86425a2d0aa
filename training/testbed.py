"""An offline testbed trained end to end with this project's own code, on text every machine has.

    python -m training.testbed --preset smoke --out runs/testbed-smoke      # minutes, 2 CPU cores
    python -m training.testbed --preset tiny --out runs/testbed-tiny        # about an hour
    python -m training.testbed --preset tiny --out D --set target_train.steps=500

Stages, in order (functions in training/build_stages/; each finished stage leaves its manifest
fragment in OUT/stages/<name>.json, and later stages read what earlier ones wrote under --out):
  corpus      Python standard-library sources (their code and docstrings), split into train and
              held-out files by a hash of the file name (stable across machines and patch releases);
  tokenizer   byte-level BPE trained on the train files, ChatML template (fixtures/tiny_models.py);
  target      a tiny Qwen3 trained from scratch (next-token LM through the shared Trainer,
              training.lm) on raw code windows of the train files plus chat-formatted examples of
              the two prompt kinds below, so that it answers through the chat template; held-out
              loss on raw windows of the held-out files;
  prompts     code-completion prompts (a few lines of a file) and chat prompts ("write the function
              `f(x)`: <first docstring line>"), from the train and the held-out files;
  regenerate  the target's own greedy replies through vLLM (training.regenerate): the training data
              (train prompts) and the held-out continuations (held-out prompts), one engine;
  tokenize    chat template -> ids + assistant loss mask;
  suites      held-out eval suites for `python -m eval run --data-dir OUT/eval`: testbed/code,
              testbed/chat and testbed/entropy (low / mixed / high tertiles of the target's mean
              per-token entropy over its own greedy continuation; category = tier);
  dflash, lilicorr, dels_gru, dels_markov
              vanilla DFlash; DFlash + LiLiCorr trained jointly; DeLS GRU and Markov short heads
              with the unigram prior, all on the same data, epochs, batch and seed;
  measure     held-out teacher-forced tau of the drafts and CE of the DeLS heads;
then OUT/systems.json (AR, DFlash, DeLS-GRU, DeLS-Markov, LiLiCorr-greedy, LiLiCorr-viterbi,
LiLiCorr+DeLS with absolute paths into OUT) and OUT/manifest.json.

Reruns: the resolved recipe is kept in OUT/recipe.json. A rerun with the same recipe on the same
--out resumes: finished stages are skipped, an interrupted one starts again (the target and the
drafts from their latest training checkpoint, regeneration from its partial output). Once
OUT/manifest.json exists the testbed is finished and a rerun changes nothing (it prints the
stored metrics). A rerun with a different recipe (other preset or --set) is refused: pass a new
--out, or delete OUT/stages/<name>.json of the stages to redo.

Layout of OUT: target/ (model + tokenizer), drafts/dflash/ (+ dels/ = GRU, dels_markov/),
drafts/lilicorr/, data/ (split, prompts, regenerated, tokenized), eval/testbed/*.jsonl,
systems.json, runs/ (training checkpoints), stages/ (manifest fragments), recipe.json,
manifest.json (command, recipe, seeds, sizes, metrics, timings, versions). Weights are fp16
safetensors (a DeLS folder's unigram prior stays fp32). vLLM is imported only inside the
regeneration stage.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from training.build_stages.corpus import (
    code_windows,
    corpus_stage,
    function_requests,
    prompts_stage,
    read_source,
    split_corpus,
)
from training.build_stages.dels import dels_stage
from training.build_stages.drafts import draft_stage
from training.build_stages.jsonl import read_jsonl
from training.build_stages.measure import measure_stage
from training.build_stages.regenerate import regenerate_stage
from training.build_stages.suites import TIERS, continuation_entropies, entropy_tiers, suites_stage
from training.build_stages.target import heldout_loss, load_target, load_tokenizer, target_stage, tokenizer_stage
from training.build_stages.tokenization import tokenize_stage
from training.build_stages.versions import versions
from training.data import TokenizedDataset, read_jsonl_conversations
from training.recipe import RECIPE_DIR, apply_overrides, load_recipe
from training.stages import run_stage
from vllm_liliprop.quiet import add_verbose_flag, quiet_after_parse

__all__ = [
    "PRESETS",
    "PRESET_DIR",
    "TIERS",
    "split_corpus",
    "code_windows",
    "function_requests",
    "heldout_loss",
    "continuation_entropies",
    "entropy_tiers",
    "draft_recipe",
    "dels_recipe",
    "systems_config",
    "run_testbed",
    "main",
]

PRESETS = ("smoke", "tiny")
# Not in training/recipes/ itself: those are drafter/DeLS recipes for the other commands.
PRESET_DIR = RECIPE_DIR / "testbed"
RECIPE_FILE = "recipe.json"


# -- the testbed recipe as the training commands' recipes ---------------------------------------

def _train_block(spec: dict, lrs: dict[str, float], output_dir: Path, seed: int) -> dict:
    return {"output_dir": str(output_dir), "epochs": spec["epochs"], "batch_size": spec["batch_size"],
            "grad_accum": 1, "precision": "fp32", "seed": seed, "save_every": 10**9, "keep_checkpoints": 1,
            "log_every": 1,  # every step in metrics.jsonl: the train-loss tail of a resumed run
            "optim": {"lr": lrs, "weight_decay": {k: 0.0 for k in lrs}, "warmup_ratio": 0.04,
                      "clip_grad_norm": 1.0}}


def draft_recipe(recipe: dict, method: str, mask_token_id: int, output_dir: Path) -> dict:
    """A training.pipeline recipe for the vanilla ("dflash") or joint ("lilicorr") drafter."""
    spec = recipe["draft_train"]
    lrs = {"drafter": spec["lr"]}
    out = {"method": method, "device": "cpu", "num_anchors": spec["num_anchors"],
           "drafter": {**recipe["drafter"], "mask_token_id": mask_token_id},
           "loss": dict(recipe["loss"]), "export_dtype": recipe["export_dtype"]}
    if method == "lilicorr":
        lrs["head"] = spec["head_lr"]
        out["lattice"] = dict(recipe["lattice"])
    out["train"] = _train_block(spec, lrs, output_dir, recipe["seed"])
    return out


def dels_recipe(recipe: dict, kind: str, output_dir: Path) -> dict:
    spec = recipe["dels"]
    return {"method": "dels", "device": "cpu", "head": {"kind": kind, **spec[kind]},
            "prior_smoothing": 1.0, "block_size": recipe["drafter"]["block_size"],
            "num_anchors": spec["num_anchors"], "alpha": spec["alpha"], "beta": spec["beta"],
            "train": _train_block(recipe["draft_train"], {"head": spec["lr"]}, output_dir, recipe["seed"])}




def systems_config(out: Path, num_spec: int) -> dict:
    """The eval systems file of the testbed (eval/README.md), with absolute paths into `out`."""
    dflash, lilicorr = str((out / "drafts/dflash").resolve()), str((out / "drafts/lilicorr").resolve())

    def spec(model):
        return {"method": "dflash", "model": model, "num_speculative_tokens": num_spec}

    return {
        "AR": {"description": "the testbed target alone: the speedup baseline"},
        "DFlash": {"description": "vanilla DFlash drafter, per-slot argmax", "speculative_config": spec(dflash)},
        "DeLS-GRU": {"description": "vanilla drafter + DeLS GRU short head (drafts/dflash/dels)",
                     "speculative_config": spec(dflash), "liliprop": {"rule": "dels", "dels_path": "dels"}},
        "DeLS-Markov": {"description": "vanilla drafter + DeLS Markov short head (drafts/dflash/dels_markov)",
                        "speculative_config": spec(dflash),
                        "liliprop": {"rule": "dels", "dels_path": "dels_markov"}},
        "LiLiCorr-greedy": {"description": "jointly trained LiLiCorr, greedy walk",
                            "speculative_config": spec(lilicorr), "liliprop": {"rule": "lattice", "walk": "greedy"}},
        "LiLiCorr-viterbi": {"description": "jointly trained LiLiCorr, exact Viterbi walk",
                             "speculative_config": spec(lilicorr), "liliprop": {"rule": "lattice", "walk": "viterbi"}},
        "LiLiCorr+DeLS": {"description": "LiLiCorr lattice walk over DeLS(GRU)-fused candidate scores",
                          "speculative_config": spec(lilicorr),
                          "liliprop": {"rule": "lattice+dels", "walk": "greedy", "dels_path": f"{dflash}/dels"}},
    }


# -- the pipeline ------------------------------------------------------------------------------------

def _check_recipe(out: Path, recipe: dict[str, Any]) -> None:
    """Refuse to continue a folder started (OUT/recipe.json) or finished (OUT/manifest.json) with
    another recipe; a new folder keeps the recipe in OUT/recipe.json."""
    path, manifest = out / RECIPE_FILE, out / "manifest.json"
    resolved = json.loads(json.dumps(recipe))
    recorded = (json.loads(path.read_text()) if path.is_file()
                else json.loads(manifest.read_text()).get("recipe") if manifest.is_file() else None)
    if recorded is not None and recorded != resolved:
        raise ValueError(f"{out} holds a testbed built with another recipe; pass a new --out "
                         "or the same preset and --set overrides")
    if recorded is None:
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(resolved, indent=2) + "\n")


def run_testbed(recipe: dict[str, Any], out: str | Path, command: str = "", log=print) -> dict[str, Any]:
    """Run (or resume) every stage of the recipe into `out`; returns the manifest (also
    OUT/manifest.json). A finished testbed is returned as it is (see the module docstring)."""
    if recipe.get("method") != "testbed":
        raise ValueError(f"recipe method must be 'testbed', got {recipe.get('method')!r}")
    out = Path(out)
    _check_recipe(out, recipe)
    if (out / "manifest.json").exists():
        log(f"[testbed] {out} is finished (manifest.json); nothing to do")
        return json.loads((out / "manifest.json").read_text())
    seed, corpus, spec = int(recipe["seed"]), recipe["corpus"], recipe["target_train"]
    regen, suites = recipe["regenerate"], recipe["suites"]
    data, runs, drafts = out / "data", out / "runs", out / "drafts"
    target_dir = out / "target"
    stages: dict[str, dict] = {}
    loaded: dict[str, Any] = {}

    def stage(name: str, fn) -> dict:
        stages[name] = run_stage(out, name, fn, log)
        return stages[name]

    def target():
        if "target" not in loaded:
            loaded["target"] = load_target(target_dir)
        return loaded["target"]

    def tokenized(part: str) -> TokenizedDataset:
        if part not in loaded:
            loaded[part] = TokenizedDataset.load(data / f"{part}_tokenized.jsonl")
        return loaded[part]

    # The split is a pure function of the recipe: recomputed on every run, written once.
    split = split_corpus(corpus["heldout_percent"], corpus["max_train_files"], corpus["max_heldout_files"])
    train_texts = [read_source(p, corpus["max_chars_per_file"]) for p in split["train"]]
    heldout_texts = [read_source(p, corpus["max_chars_per_file"]) for p in split["heldout"]]
    stage("corpus", lambda: corpus_stage(split, data / "split.json"))
    stage("tokenizer", lambda: tokenizer_stage(train_texts, recipe["tokenizer"]["vocab_size"], target_dir))
    stage("target", lambda: target_stage(train_texts, heldout_texts, corpus, recipe["target"], spec, seed,
                                         target_dir, runs / "target", log=log))
    log(f"[testbed] target held-out loss {stages['target']['heldout_loss']} nats/token")
    stage("prompts", lambda: prompts_stage(split, corpus, regen, suites, seed, data))

    # The engine runs in this process, so dropping it frees its cores for the training stages
    # (an engine-core subprocess would outlive the generator); a tiny target needs 1 GiB of KV.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    stage("regenerate", lambda: regenerate_stage(
        target_dir, {"train": (data / "train_prompts.jsonl", data / "regenerated.jsonl"),
                     "heldout": (data / "heldout_prompts.jsonl", data / "heldout_regenerated.jsonl")},
        max_tokens=regen["max_tokens"], max_model_len=regen["max_model_len"], seed=seed, progress=False,
        dtype="float32", enforce_eager=True))

    def tokenize():
        # One held-out example per held-out prompt, in prompt order (the suites index both alike).
        by_id = {str(r["id"]): r for r in read_jsonl_conversations(data / "heldout_regenerated.jsonl")}
        heldout = [by_id[p["id"]] for p in read_jsonl(data / "heldout_prompts.jsonl")]
        fragment = tokenize_stage(load_tokenizer(target_dir), {
            "train": (read_jsonl_conversations(data / "regenerated.jsonl"), data / "train_tokenized.jsonl"),
            "heldout": (heldout, data / "heldout_tokenized.jsonl")},
            regen["max_model_len"], min_supervised={"heldout": 0})
        if fragment["train"]["examples"] == 0:
            raise ValueError("the target regenerated no usable training example; raise regenerate.max_tokens")
        return fragment

    stage("tokenize", tokenize)
    stage("suites", lambda: suites_stage(target(), read_jsonl(data / "heldout_prompts.jsonl"), tokenized("heldout"),
                                         suites, out / "eval/testbed"))

    # drafts: same data, epochs, batch, anchors and seed for every one
    mask_token_id = load_tokenizer(target_dir).convert_tokens_to_ids("<|mask|>")
    for method in ("dflash", "lilicorr"):
        stage(method, lambda method=method: draft_stage(
            draft_recipe(recipe, method, mask_token_id, runs / method), drafts / method, target_dir,
            target_model=target(), dataset=tokenized("train"), progress=False, tail_steps=10))
    dels_dirs = {"gru": drafts / "dflash/dels", "markov": drafts / "dflash/dels_markov"}
    for kind, folder in dels_dirs.items():
        stage(f"dels_{kind}", lambda kind=kind, folder=folder: dels_stage(
            dels_recipe(recipe, kind, runs / f"dels_{kind}"), folder, torch.float16,
            embed_weight=target().get_input_embeddings().weight.detach().float(), dataset=tokenized("train"),
            tokenizer=load_tokenizer(target_dir), progress=False, tail_steps=10))

    # held-out measurements of the drafts (teacher-forced on the target's greedy continuations)
    block = recipe["drafter"]["block_size"]
    stage("measure", lambda: measure_stage(target(), tokenized("heldout"), drafts / "dflash", drafts / "lilicorr",
                                           recipe["draft_train"]["num_anchors"], seed, dels_dirs=dels_dirs,
                                           block_size=block))

    systems = systems_config(out, block - 1)
    (out / "systems.json").write_text(json.dumps(systems, indent=2) + "\n")
    manifest = _manifest(out, recipe, stages, command, versions())
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"[testbed] wrote {out / 'manifest.json'}")
    return manifest


def _manifest(out: Path, recipe: dict, stages: dict[str, dict], command: str, versions: dict) -> dict:
    """The testbed manifest from the stages' fragments."""
    seed, spec, regen = int(recipe["seed"]), recipe["target_train"], recipe["regenerate"]
    target, tokenized, measure = stages["target"], stages["tokenize"], stages["measure"]
    metrics: dict[str, Any] = {
        "target_train_loss": target["train_loss"],
        "target_heldout_loss": target["heldout_loss"],
        "target_heldout_chat_loss": target["heldout_chat_loss"],
        "target_heldout_perplexity": target["heldout_perplexity"],
        "entropy_tier_mean": stages["suites"]["entropy_tier_mean"],
    }
    for method in ("dflash", "lilicorr"):
        metrics[f"{method}_train_loss"] = stages[method]["train_tail"].get("loss")
    for kind in ("gru", "markov"):
        metrics[f"dels_{kind}_train_ce"] = stages[f"dels_{kind}"]["train_tail"].get("ce")
    tau = measure["heldout_tau"]
    metrics["heldout_tau_dflash"] = tau["dflash"]
    metrics["heldout_tau_lilicorr_argmax"] = tau["lilicorr_argmax"]
    metrics["heldout_tau_lilicorr_greedy_walk"] = tau["lilicorr_greedy_walk"]
    for kind in ("gru", "markov"):
        metrics[f"dels_{kind}_heldout_ce"] = measure["dels_heldout_ce"][kind]
    timings = {name: fragment["seconds"] for name, fragment in stages.items()}
    target_dir, suites = out / "target", recipe["suites"]
    return {
        "command": command,
        "recipe": recipe,
        "seeds": {"recipe": seed, "target_init_and_batches": seed, "prompt_sampling": seed,
                  "drafts": seed, "vllm": seed},
        "sizes": {
            "train_files": stages["corpus"]["train_files"], "heldout_files": stages["corpus"]["heldout_files"],
            "vocab_size": stages["tokenizer"]["vocab_size"], "target_parameters": target["parameters"],
            "target_train_sequences": target["train_sequences"], "target_train_tokens_seen": target["tokens_seen"],
            "heldout_windows": target["heldout_windows"],
            "regenerated_conversations": stages["regenerate"]["conversations"]["train"],
            "train_examples": tokenized["train"]["examples"],
            "train_supervised_tokens": tokenized["train"]["supervised_tokens"],
            "heldout_examples": tokenized["heldout"]["examples"],
            "suites": stages["suites"]["suites"],
        },
        "metrics": metrics,
        "timings_s": {**timings, "total": round(sum(timings.values()), 2)},
        "artifacts": {"target": "target", "dflash": "drafts/dflash", "lilicorr": "drafts/lilicorr",
                      "dels_gru": "drafts/dflash/dels", "dels_markov": "drafts/dflash/dels_markov",
                      "eval_data_dir": "eval", "systems": "systems.json"},
        "eval_command": (f"python -m eval run --target {target_dir.resolve()} --systems {(out / 'systems.json').resolve()} "
                         f"--benchmarks testbed --data-dir {(out / 'eval').resolve()} --temperatures 0 "
                         f"--max-tokens {suites['max_tokens']} --engine-flags "
                         + shlex.quote(json.dumps({"dtype": "float32", "max_model_len": regen["max_model_len"],
                                                   "enforce_eager": True}))
                         + f" --results {(out / 'results.csv').resolve()}"),
        "versions": versions,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.testbed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=PRESETS, default=None, help="built-in recipe training/recipes/testbed/<preset>.json")
    parser.add_argument("--recipe", default=None, help="a testbed recipe JSON path (instead of --preset)")
    parser.add_argument("--out", required=True, help="output folder (a rerun with the same recipe resumes; "
                                                     "a finished one is left as it is)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a recipe field, e.g. --set target_train.steps=500 (repeatable)")
    parser.add_argument("--print-recipe", action="store_true", help="print the resolved recipe and exit")
    add_verbose_flag(parser)
    args = parser.parse_args(argv)
    quiet_after_parse(args)  # libraries at WARNING unless --verbose
    if (args.preset is None) == (args.recipe is None):
        parser.error("pass exactly one of --preset or --recipe")
    recipe = apply_overrides(load_recipe(args.recipe or PRESET_DIR / f"{args.preset}.json"), args.overrides)
    if args.print_recipe:
        print(json.dumps(recipe, indent=2))
        return 0
    argv_list = list(sys.argv[1:] if argv is None else argv)
    command = shlex.join(["python", "-m", "training.testbed", *argv_list])
    manifest = run_testbed(recipe, args.out, command=command)
    print(json.dumps(manifest["metrics"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
