"""Tidy CSVs for the tables that come from training artefacts rather than eval runs.

`python -m eval heads-table HEAD_DIR... --out F.csv`: one row per DeLS head folder x draft
position (DeLS-Spec Table 7): the fusion weights alpha and beta that head applies at that
position, read from its config.json (vllm_liliprop.heads.dels_io.DelsConfig). A scalar weight is
one fixed number for every position ("fixed"); a list is a per-slot schedule, as the learnable
variant (`training.train_dels`, stage "fusion") writes it ("learned"). A scalar is spread over
the positions of the drafter the folder sits in (its config.json block_size - 1), or --positions.

`python -m eval training-cost --manifest M [--runs-root D] --out F.csv`: one row per training
stage of a testbed / pipeline manifest (DeLS-Spec Table 5): wall time (the stage record's
seconds), steps, and peak memory when recorded: the stage record's own peak fields, else the
trainer's run record `run.json` (training.trainer.Trainer.fit) in D/<recipe train.output_dir>
(or that folder itself when it is absolute, as the tiny testbed writes it);
empty = not recorded (runs made before the trainer recorded it).

Both files carry their provenance (source file, its sha256, git revision, time written).
plots renders them (`python -m plots all --dels-weights F --training-cost F`).
"""

from __future__ import annotations

import datetime
import hashlib
import json
from pathlib import Path

import pandas as pd

from eval.results import git_revision
from vllm_liliprop.heads.dels_io import CONFIG_NAME, DelsConfig, find_dels_dir

HEADS_COLUMNS = ["head", "kind", "position", "alpha", "beta", "weights", "pure_draft_prefix_len", "head_dir",
                 "config_sha256", "tokenizer_fingerprint", "git_rev", "written"]
COST_COLUMNS = ["stage", "method", "head_kind", "device", "precision", "batch_size", "epochs", "steps",
                "wall_s", "peak_rss_mib", "peak_cuda_mib", "memory_source", "manifest", "manifest_sha256",
                "git_rev", "written"]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _drafter_positions(head_dir: Path) -> int | None:
    """Draft positions of the drafter folder holding the head (block_size - 1), if it says."""
    config = head_dir.parent / "config.json"
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    block = (data.get("dflash_config") or {}).get("block_size") or data.get("block_size")
    return int(block) - 1 if isinstance(block, int) and block > 1 else None


def heads_table(paths: list[str | Path], positions: int | None = None,
                names: list[str] | None = None) -> pd.DataFrame:
    """Per-position alpha/beta of DeLS head folders (each a head folder or a folder holding dels/)."""
    rows, rev, written = [], git_revision(), _now()
    for i, path in enumerate(paths):
        folder = find_dels_dir(path)
        config_path = folder / CONFIG_NAME
        try:
            config = DelsConfig.from_dict(json.loads(config_path.read_text()))
        except ValueError as exc:
            raise ValueError(f"{config_path}: {exc}") from None
        learned = isinstance(config.alpha, list) or isinstance(config.beta, list)
        lengths = [len(w) for w in (config.alpha, config.beta) if isinstance(w, list)]
        count = min(lengths) if lengths else (positions or _drafter_positions(folder))
        if not count:
            raise ValueError(f"{folder}: alpha and beta are single numbers and the folder above it names no "
                             "block_size; pass --positions N (the drafter's speculative tokens)")
        alpha, beta = config.slot_weights("alpha", count), config.slot_weights("beta", count)
        name = names[i] if names and i < len(names) else folder.name
        for position in range(count):
            rows.append({"head": name, "kind": config.kind, "position": position + 1,
                         "alpha": alpha[position], "beta": beta[position],
                         "weights": "learned" if learned else "fixed",
                         "pure_draft_prefix_len": config.pure_draft_prefix_len, "head_dir": str(folder),
                         "config_sha256": _sha256(config_path),
                         "tokenizer_fingerprint": config.tokenizer_fingerprint or "",
                         "git_rev": rev, "written": written})
    return pd.DataFrame(rows, columns=HEADS_COLUMNS)


def _run_record(runs_root: Path | None, recipe: dict) -> tuple[dict, str]:
    output_dir = (recipe.get("train") or {}).get("output_dir")
    if not output_dir or (runs_root is None and not Path(output_dir).is_absolute()):
        return {}, ""
    path = Path(runs_root or "/") / output_dir / "run.json"  # an absolute output_dir stands alone
    try:
        return json.loads(path.read_text()), str(path)
    except (OSError, ValueError):
        return {}, ""


def training_cost(manifests: list[str | Path], runs_root: str | Path | None = None) -> pd.DataFrame:
    """One row per stage with a training recipe (recipe.train) in each manifest's stages."""
    rows, rev, written = [], git_revision(), _now()
    for manifest in manifests:
        manifest = Path(manifest)
        try:
            data = json.loads(manifest.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{manifest}: not a readable manifest.json ({exc})") from None
        stages = data.get("stages")
        if not isinstance(stages, dict):
            raise ValueError(f"{manifest} has no 'stages' object; pass a testbed or pipeline manifest.json")
        digest = _sha256(manifest)
        for name, stage in stages.items():
            recipe = stage.get("recipe") if isinstance(stage, dict) else None
            if not isinstance(recipe, dict) or not isinstance(recipe.get("train"), dict):
                continue
            train = recipe["train"]
            record, record_path = _run_record(None if runs_root is None else Path(runs_root), recipe)
            rss = stage.get("peak_rss_mib", record.get("peak_rss_mib"))
            cuda = stage.get("peak_cuda_mib", record.get("peak_cuda_mib"))
            source = ("stage record" if "peak_rss_mib" in stage or "peak_cuda_mib" in stage
                      else record_path if record else "")
            rows.append({"stage": name, "method": recipe.get("method", ""),
                         "head_kind": (recipe.get("head") or {}).get("kind", ""),
                         "device": recipe.get("device", ""), "precision": train.get("precision", ""),
                         "batch_size": train.get("batch_size"), "epochs": train.get("epochs"),
                         "steps": stage.get("steps", record.get("steps")), "wall_s": stage.get("seconds"),
                         "peak_rss_mib": rss, "peak_cuda_mib": cuda, "memory_source": source,
                         "manifest": str(manifest), "manifest_sha256": digest, "git_rev": rev,
                         "written": written})
    if not rows:
        raise ValueError(f"no stage with a training recipe (recipe.train) in {', '.join(map(str, manifests))}")
    return pd.DataFrame(rows, columns=COST_COLUMNS)


def add_parsers(sub) -> None:
    """The heads-table and training-cost subcommands (registered by eval.cli)."""
    heads = sub.add_parser("heads-table", help="CSV of DeLS heads' per-position alpha/beta (DeLS Table 7)")
    heads.add_argument("heads", nargs="+", help="DeLS head folders (or draft folders holding dels/)")
    heads.add_argument("--name", action="append", default=[], help="row label per head, in order "
                                                                   "(default: the folder name)")
    heads.add_argument("--positions", type=int, help="positions for fixed (scalar) weights when the drafter "
                                                     "folder names no block_size")
    heads.add_argument("--out", required=True, help="CSV to write")
    cost = sub.add_parser("training-cost", help="CSV of training wall time and peak memory per stage "
                                                "(DeLS Table 5) from manifest.json files")
    cost.add_argument("--manifest", action="append", required=True, help="manifest.json (repeatable)")
    cost.add_argument("--runs-root", help="the pipeline's --out folder, whose <train.output_dir>/run.json "
                                          "holds the trainer's peak memory")
    cost.add_argument("--out", required=True, help="CSV to write")


def run(args) -> int:
    if args.command == "heads-table":
        frame = heads_table(args.heads, args.positions, args.name)
    else:
        frame = training_cost(args.manifest, args.runs_root)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out, index=False)
    print(f"wrote {len(frame)} rows to {args.out}")
    return 0
