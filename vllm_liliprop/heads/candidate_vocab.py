"""A LiLiCorr draft's candidate vocabulary: the target ids its lattice candidates are drawn from.

Upstream's LiLiCorr draws each slot's top-K candidates over the full target vocabulary, so every
step pays the target's whole LM head ([V, H]: 49,152 x 576 for SmolLM2, 3.7 ms of a ~60 ms CPU
step). A DFlash drafter's reduced vocabulary (its `d2t`, the most frequent 16,384 ids) already holds
almost every candidate: on the 96 held-out conversations the shipped head walks to the same tau
over either (2.1786 over 16,384 ids, 2.1759 over all; testbed/smollm2/round3/lilicorr_head/).

liliprop extension (additive; upstream ignores subfolders): `<draft>/candidate_vocab/model.safetensors`
holding `target_ids` [n], strictly increasing int64 target ids, n >= lilicorr_candidate_topk. A
draft with it scores the LM head rows of those ids only; candidates and their log-probs are then
the top-K of the logits restricted to them (log-probs normalized over them), as a reduced-vocabulary
DFlash draft's are. Delete the folder to serve upstream's full-vocabulary lattice.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

FOLDER = "candidate_vocab"
KEY = "target_ids"


def read_candidate_vocab(draft_dir: Path | None, vocab_size: int, topk: int) -> torch.Tensor | None:
    """The draft's candidate target ids [n] (int64, increasing), or None where it has none."""
    if draft_dir is None or not (Path(draft_dir) / FOLDER).is_dir():
        return None
    path = Path(draft_dir) / FOLDER / "model.safetensors"
    fix = (f"write it with python -m training.candidate_vocab, or delete {path.parent} to serve the "
           "full-vocabulary lattice")
    try:
        ids = load_file(str(path)).get(KEY)
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"{path} cannot be read ({exc}); {fix}") from None
    if ids is None or ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{path} needs a 1-D integer tensor '{KEY}'; {fix}")
    ids = ids.to(torch.int64)
    if ids.numel() < topk:
        raise ValueError(f"{path}: {ids.numel()} ids, fewer than lilicorr_candidate_topk = {topk}; {fix}")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"{path}: ids must lie in [0, {vocab_size}) (the target vocabulary); {fix}")
    if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
        raise ValueError(f"{path}: ids must be strictly increasing; {fix}")
    return ids


def write_candidate_vocab(draft_dir: Path, target_ids: torch.Tensor) -> Path:
    """Store `target_ids` as the draft's candidate vocabulary (sorted, deduplicated)."""
    folder = Path(draft_dir) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    save_file({KEY: torch.unique(target_ids.to(torch.int64)).contiguous()}, str(folder / "model.safetensors"))
    return folder
