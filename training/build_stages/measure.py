"""Stage "measure": held-out, teacher-forced quality of the exported drafts on the target's own
greedy continuations (a TokenizedDataset whose supervised tokens are the target's output)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from training.data import collate
from training.export import load_dflash, load_domino, load_dspark, load_lilicorr, read_draft_vocab
from training.features import OnlineFeatures, frozen_target_weights
from training.headroom_metrics import headroom_metrics, rounded
from training.losses import LossWeights
from training.objective import DraftObjective
from training.train_dels import ShortHeadObjective
from training.trainer import seeds_for
from vllm_liliprop.heads.dels_io import load_dels_head

__all__ = ["acceptance", "drafter_acceptance", "sequential_head_acceptance", "dels_heldout_ce", "measure_stage",
           "measure_baselines_stage"]


def drafter_acceptance(draft_dir: Path, lilicorr: bool, target, dataset, num_anchors: int, seed: int) -> dict:
    """Teacher-forced greedy acceptance of an exported draft (`acceptance`). A draft with a
    reduced vocabulary (d2t) is scored over that vocabulary, as vLLM serves it."""
    drafter, lattice = load_lilicorr(draft_dir) if lilicorr else (load_dflash(draft_dir), None)
    return acceptance(drafter, lattice, read_draft_vocab(draft_dir), target, dataset, num_anchors, seed)


@torch.no_grad()
def acceptance(drafter, lattice, vocab_ids, target, dataset, num_anchors: int, seed: int) -> dict:
    """Teacher-forced greedy acceptance of a drafter (and LiLiCorr head) on a tokenized dataset
    whose supervised tokens are the target's own greedy output: mean accepted length per block
    of the per-slot argmax ("accept_argmax") and, with a head, of the greedy lattice walk
    ("accept_walk"); "headroom": `headroom_metrics` over the same blocks. Runs on the target's
    device in fp32; the modules are put back in the mode and dtype they had."""
    device = next(target.parameters()).device
    modules = [m for m in (drafter, lattice) if m is not None]
    modes = [(m.training, next(m.parameters()).dtype) for m in modules]
    for m in modules:
        m.eval().float()
    embed, lm_head = frozen_target_weights(target)
    objective = DraftObjective(drafter, embed.float(), lm_head.float(), lattice=lattice,
                               weights=LossWeights(distractor=0.0), num_anchors=num_anchors,
                               vocab_ids=None if vocab_ids is None else vocab_ids.to(device),
                               slot_outcomes=True)
    features = OnlineFeatures(target, drafter.config.target_layer_ids, final_hidden=False)
    sums: dict[str, float] = {}
    slots: dict[str, list[torch.Tensor]] = {}
    blocks = 0.0
    for i in range(len(dataset)):
        batch = {k: v.to(device) for k, v in collate([dataset[i]]).items()}
        terms = objective(batch["input_ids"], batch["loss_mask"], features(batch)["target_taps"].float(),
                          seeds_for([i], seed, 0))
        n = float(terms["blocks"])
        blocks += n
        for key in ("accept_argmax", "accept_walk"):
            if key in terms:
                sums[key] = sums.get(key, 0.0) + float(terms[key]) * n
        for key in ("true_rank", "slot_valid", "walk_hit"):
            if key in terms:
                slots.setdefault(key, []).append(terms[key].cpu())
    for m, (training, dtype) in zip(modules, modes):
        m.to(dtype).train(training)
    result = {key: value / max(blocks, 1.0) for key, value in sums.items()}
    result["headroom"] = headroom_metrics(**{key: torch.cat(parts) for key, parts in slots.items()}) if slots else None
    return result


@torch.no_grad()
def sequential_head_acceptance(draft_dir: Path, kind: str, target, dataset, num_anchors: int,
                               seed: int) -> float:
    """Held-out greedy tau of a DSpark or Domino draft. Teacher forcing gives it exactly: up to
    the first miss a greedy left-to-right draft consumed the true tokens, so its accepted prefix
    is the teacher-forced argmax's."""
    embed, lm_head = frozen_target_weights(target)
    drafter, head = load_dspark(draft_dir) if kind == "dspark" else load_domino(draft_dir, embed.float())
    objective = DraftObjective(drafter.eval(), embed.float(), lm_head.float(), correction=head.eval(),
                               weights=LossWeights(distractor=0.0), num_anchors=num_anchors,
                               vocab_ids=read_draft_vocab(draft_dir))
    features = OnlineFeatures(target, drafter.config.target_layer_ids, final_hidden=False)
    accepted, blocks = 0.0, 0.0
    for i in range(len(dataset)):
        batch = collate([dataset[i]])
        terms = objective(batch["input_ids"], batch["loss_mask"], features(batch)["target_taps"],
                          seeds_for([i], seed, 0))
        accepted += float(terms["accept_argmax"]) * float(terms["blocks"])
        blocks += float(terms["blocks"])
    return 1 + accepted / max(blocks, 1.0)


def measure_baselines_stage(target, heldout, drafts: dict[str, str | Path], num_anchors: int,
                            seed: int) -> dict[str, Any]:
    """Held-out tau of the baselines' drafts ({"dspark": dir, "domino": dir}), on the anchors of
    the measure stage (same seed), so the numbers compare with its heldout_tau."""
    return {"heldout_examples": len(heldout), "anchors_per_example": num_anchors,
            "heldout_tau": {kind: round(sequential_head_acceptance(Path(folder), kind, target, heldout,
                                                                   num_anchors, seed), 4)
                            for kind, folder in drafts.items()}}


@torch.no_grad()
def dels_heldout_ce(dels_dir: Path, embed: torch.Tensor, dataset, block_size: int, num_anchors: int,
                    seed: int) -> float:
    """Next-token CE of an exported short head on a held-out TokenizedDataset (as in training)."""
    head, _, _ = load_dels_head(dels_dir, embed.float(), embed.shape[0])
    objective = ShortHeadObjective(head.eval(), block_size, num_anchors)
    total, count = 0.0, 0.0
    for i in range(len(dataset)):
        batch = collate([dataset[i]])
        terms = objective(batch["input_ids"], batch["loss_mask"], seeds_for([i], seed, 0))
        total += float(terms["loss"]) * float(terms["supervised"])
        count += float(terms["supervised"])
    return total / max(count, 1.0)


def measure_stage(target, heldout, dflash_dir: str | Path, lilicorr_dir: str | Path, num_anchors: int, seed: int,
                  *, dels_dirs: dict[str, str | Path] | None = None, block_size: int | None = None) -> dict[str, Any]:
    """target: the target model (fp32, eval); heldout: a TokenizedDataset of held-out prompts.

    Returns {"heldout_examples", "anchors_per_example", "heldout_tau": {"dflash",
    "lilicorr_argmax", "lilicorr_greedy_walk"}} (tau = 1 + mean accepted drafts per block),
    "headroom": {"dflash", "lilicorr"} (`headroom_metrics`, on the same blocks) and, given
    dels_dirs {name: DeLS folder} and the block size, "dels_heldout_ce": {name: nats/token}.
    """
    dflash = drafter_acceptance(Path(dflash_dir), False, target, heldout, num_anchors, seed)
    lilicorr = drafter_acceptance(Path(lilicorr_dir), True, target, heldout, num_anchors, seed)
    fragment: dict[str, Any] = {
        "heldout_examples": len(heldout), "anchors_per_example": num_anchors,
        "heldout_tau": {"dflash": round(1 + dflash["accept_argmax"], 4),
                        "lilicorr_argmax": round(1 + lilicorr["accept_argmax"], 4),
                        "lilicorr_greedy_walk": round(1 + lilicorr["accept_walk"], 4)},
        "headroom": {"dflash": rounded(dflash["headroom"]), "lilicorr": rounded(lilicorr["headroom"])}}
    if dels_dirs:
        if block_size is None:
            raise ValueError("measure_stage needs the block size to measure DeLS heads")
        embed = target.get_input_embeddings().weight.detach().float()
        fragment["dels_heldout_ce"] = {
            name: round(dels_heldout_ce(Path(folder), embed, heldout, block_size, num_anchors, seed), 4)
            for name, folder in dels_dirs.items()}
    return fragment
