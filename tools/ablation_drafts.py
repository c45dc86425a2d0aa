"""Serving variants of shipped drafts for the served ablations (issue 18), written next to them.

    python -m tools.ablation_drafts --drafts testbed/smollm2/round3/drafts --out .cache/ablation_drafts

Writes, from DRAFTS (a folder with dflash/{dels,dels_markov} and lilicorr/), into OUT:
- dels_p0/, dels_p1/, dels_markov_p0/, dels_markov_p1/: the shipped DeLS heads with their
  `pure_draft_prefix_len` set to 0 or 1, nothing else changed: P = 0 corrects every slot and
  feeds the anchor to the short head first, P = 1 (DeLS-Spec's layout) leaves slot 0 to the
  drafter and starts the short prefix at the first drafted token;
- lilicorr_k4/: the shipped LiLiCorr draft served with K = 4 candidates per slot: its head was
  trained at K = 8 and its only K-shaped weight, the candidate-rank embedding, keeps its first
  four rows (ranks 0-3, the candidates a top-4 lattice has). A larger K has no trained rank
  embeddings, so K = 16 needs a head trained for it.
Weight files that do not change are symbolic links to the shipped ones.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from safetensors.torch import load_file, save_file

RANK_EMBEDDING = "lilicorr.rank_embedding"


def _fresh(folder: Path) -> Path:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def _link_all_but(source: Path, destination: Path, keep: set[str]) -> None:
    for item in source.iterdir():
        if item.name not in keep and item.is_file():
            (destination / item.name).symlink_to(item.resolve())


def dels_prefix_variant(head_dir: Path, out_dir: Path, prefix_len: int) -> Path:
    """A DeLS head folder served with pure_draft_prefix_len = prefix_len."""
    _link_all_but(head_dir, _fresh(out_dir), {"config.json"})
    config = json.loads((head_dir / "config.json").read_text())
    config["pure_draft_prefix_len"] = prefix_len
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


def lilicorr_topk_variant(draft_dir: Path, out_dir: Path, topk: int) -> Path:
    """A LiLiCorr draft served with fewer candidates per slot than it was trained with."""
    config = json.loads((draft_dir / "config.json").read_text())
    trained = int(config["dflash_config"]["lilicorr_candidate_topk"])
    if not 1 <= topk <= trained:
        raise ValueError(f"K = {topk}: a head trained at K = {trained} has rank embeddings for "
                         f"ranks 0..{trained - 1} only; choose 1 <= K <= {trained}")
    _link_all_but(draft_dir, _fresh(out_dir), {"config.json", "model.safetensors"})
    tensors = load_file(str(draft_dir / "model.safetensors"))
    if RANK_EMBEDDING not in tensors:
        raise ValueError(f"{draft_dir}/model.safetensors has no {RANK_EMBEDDING}: not a LiLiCorr draft")
    tensors[RANK_EMBEDDING] = tensors[RANK_EMBEDDING][..., :topk, :].contiguous()
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config["dflash_config"]["lilicorr_candidate_topk"] = topk
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


def write_variants(drafts: Path, out: Path) -> list[Path]:
    written = [dels_prefix_variant(drafts / "dflash" / kind, out / f"{kind}_p{p}", p)
               for kind in ("dels", "dels_markov") for p in (0, 1)]
    written.append(lilicorr_topk_variant(drafts / "lilicorr", out / "lilicorr_k4", 4))
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.ablation_drafts", description=__doc__.split("\n")[0])
    parser.add_argument("--drafts", required=True, help="shipped drafts folder (testbed/smollm2/round3/drafts)")
    parser.add_argument("--out", required=True, help="folder for the variants (replaced)")
    args = parser.parse_args(argv)
    for path in write_variants(Path(args.drafts), Path(args.out)):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
