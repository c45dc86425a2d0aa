"""Build and run a DFlash training, or a joint one with a LiLiCorr, DSpark or Domino head, from a
recipe dict.

Recipe fields (defaults in brackets):
  method          "dflash" | "lilicorr" | "dspark" | "domino"
  target          target model (HF id or local dir); its tokenizer and chat template are used
  target_dtype    ["bfloat16"] dtype the frozen target runs in ("auto": bfloat16 where bf16 is
                  fast: CUDA, or a CPU whose bf16 matmul is measured 1.3x fp32; else float32)
  data            tokenized dataset .jsonl (`python -m training.data`)
  features        {"mode": "online"} [default] or {"mode": "cached", "dir": ...}
  device          ["auto"]: cuda:<local_rank> when available, else cpu
  drafter         {"num_hidden_layers": 5, "block_size": 16, "mask_token_id": int,
                   "target_layer_ids": null (evenly spaced), "intermediate_size": null,
                   "init_from": null (a DFlash/LiLiCorr dir to start from; the other fields
                   must then match it, except block_size, which it takes over)}
  lattice         (lilicorr) {"candidate_topk": 8, "hidden_size": 1024, "num_layers": 2,
                   "num_heads": 8, "mlp_ratio": 2.0, "factor_dim": 1024, "vector_eps": 1e-6,
                   "logit_scale": 8.0, "init_from": null}
  dspark          (dspark) {"markov_rank": 64}: DSpark's Markov head, trained jointly with the
                  drafter on the corrected logits (teacher-forced previous tokens)
  domino          (domino) {"rank": 64}: Domino's GRU + low-rank residual head, likewise
  loss            LossWeights fields (Table 4 defaults)
  num_anchors     [512] anchors per sequence
  train_vocab     [null] {"size": N}: the loss's softmax runs over the N tokens most often
                  supervised in the data (extension for CPU budgets)
  export_vocab    ["full"; "train" for dspark/domino with a train_vocab] | "train" (needs
                  train_vocab): export the draft with upstream's reduced vocabulary
                  (draft_vocab_size, lm_head, d2t) over the train_vocab ids, so that serving
                  computes the logits it was trained on and its LM head reads train_vocab.size
                  rows instead of the target's vocabulary. Upstream LiLiCorr requires the full
                  vocabulary, so lilicorr refuses it; the DSpark and Domino heads score the
                  train_vocab ids only, so those methods export with it.
  train           TrainConfig fields (output_dir required)
  export_dtype    ["bfloat16"]
The final model is exported to <output_dir>/final (DFlashDraftModel, LiLiCorrDraftModel,
Qwen3DSparkModel, or a DFlash directory with a domino/ head).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from training.data import TokenizedDataset, collate, training_vocabulary
from training.drafter import DFlashDrafter, DrafterConfig
from training.export import (
    export_dflash, export_domino, export_dspark, export_lilicorr, load_dflash, load_lilicorr
)
from training.features import CachedFeatures, OnlineFeatures, frozen_target_weights
from training.losses import LossWeights
from training.objective import DraftObjective
from training.startup import load_frozen_target, start_run
from training.trainer import Trainer, seeds_for
from vllm_liliprop.heads.domino import DominoConfig, DominoHead
from vllm_liliprop.heads.dspark import MarkovBiasHead
from vllm_liliprop.heads.lattice import LatticeConfig, LatticeHead

__all__ = ["build_lattice", "build_drafter", "prepare_draft_training", "run_draft_training", "DraftRun",
           "DEFAULT_LATTICE"]

DEFAULT_LATTICE = {
    "candidate_topk": 8,
    "hidden_size": 1024,
    "num_layers": 2,
    "num_heads": 8,
    "mlp_ratio": 2.0,
    "factor_dim": 1024,
    "vector_eps": 1e-6,
    "logit_scale": 8.0,
}


# Recipe fields a loaded drafter takes over: its weights do not depend on them (a block is
# positions under RoPE plus the mask token), so a block-8 drafter can be trained on at 16.
LOADED_DRAFTER_OVERRIDES = ("block_size",)


def _loaded_drafter(init_from: str | Path, spec: dict[str, Any]) -> DFlashDrafter:
    """The drafter in `init_from`, with the recipe's block size; every other recipe field must
    agree with the checkpoint, so that no setting is silently ignored."""
    drafter = load_dflash(init_from)
    for key, value in spec.items():
        current = getattr(drafter.config, key)
        if key in LOADED_DRAFTER_OVERRIDES:
            drafter.config = replace(drafter.config, **{key: value})
        elif value is not None and value != current:
            raise ValueError(f"recipe drafter.{key} = {value!r}, but drafter.init_from {init_from} has "
                             f"{current!r}: a loaded drafter keeps its weights' shapes; remove drafter.{key} "
                             f"(only {', '.join(LOADED_DRAFTER_OVERRIDES)} may differ) or drop drafter.init_from")
    return drafter


DRAFTER_FIELDS = {"num_hidden_layers", "block_size", "mask_token_id", "target_layer_ids", "intermediate_size"}


def build_drafter(spec: dict[str, Any], target_config) -> DFlashDrafter:
    spec = dict(spec)
    init_from = spec.pop("init_from", None)
    unknown = set(spec) - DRAFTER_FIELDS
    if unknown:
        raise ValueError(f"unknown recipe drafter fields {sorted(unknown)}; known: {sorted(DRAFTER_FIELDS | {'init_from'})}")
    if init_from:
        return _loaded_drafter(init_from, spec)
    if "mask_token_id" not in spec:
        raise ValueError("recipe drafter.mask_token_id is required (a token id the target never emits)")
    return DFlashDrafter(DrafterConfig.from_target(target_config, **spec))


def build_lattice(spec: dict[str, Any], drafter_config: DrafterConfig) -> LatticeHead:
    spec = {**DEFAULT_LATTICE, **spec}
    init_from = spec.pop("init_from", None)
    if init_from:
        _, lattice = load_lilicorr(init_from)
        return lattice
    dflash = {f"lilicorr_{k}": v for k, v in spec.items()}
    config = LatticeConfig.from_dflash_config(
        dflash, drafter_config.hidden_size, drafter_config.block_size, drafter_config.rms_norm_eps
    )
    return LatticeHead(config)


def _uses_autocast(precision: str, device: torch.device) -> bool:
    return precision == "bf16" or (precision == "auto" and device.type == "cuda")


def _lattice_config_dict(config: LatticeConfig) -> dict[str, Any]:
    return asdict(config)


METHODS = ("dflash", "lilicorr", "dspark", "domino")
SEQUENTIAL_HEADS = ("dspark", "domino")


def _export_vocab(recipe: dict[str, Any], method: str) -> str:
    sequential = method in SEQUENTIAL_HEADS
    choice = recipe.get("export_vocab", "train" if sequential and recipe.get("train_vocab") else "full")
    if choice not in ("full", "train"):
        raise ValueError(f"export_vocab must be 'full' or 'train', got {choice!r}")
    if sequential and choice == "full" and recipe.get("train_vocab"):
        raise ValueError(f"export_vocab = 'full' with train_vocab: the {method} head scores the "
                         "train_vocab ids only; remove export_vocab (it then follows train_vocab)")
    if choice == "train" and method == "lilicorr":
        raise ValueError("export_vocab = 'train' is for methods dflash, dspark and domino: upstream "
                         "LiLiCorr drafts need the full target vocabulary; remove export_vocab from "
                         "the recipe")
    if choice == "train" and not recipe.get("train_vocab"):
        raise ValueError("export_vocab = 'train' needs train_vocab = {'size': N} in the recipe")
    return choice


def build_sequential_head(method: str, spec: dict[str, Any], drafter_config: DrafterConfig,
                          embed_weight: torch.Tensor, head_ids: torch.Tensor) -> torch.nn.Module:
    """The DSpark Markov head or the Domino head, scoring `head_ids` (target ids)."""
    if method == "dspark":
        unknown = set(spec) - {"markov_rank"}
        if unknown:
            raise ValueError(f"unknown recipe dspark fields {sorted(unknown)}; known: ['markov_rank']")
        return MarkovBiasHead(drafter_config.vocab_size, int(head_ids.numel()),
                              int(spec.get("markov_rank", 64)))
    unknown = set(spec) - {"rank"}
    if unknown:
        raise ValueError(f"unknown recipe domino fields {sorted(unknown)}; known: ['rank']")
    config = DominoConfig(vocab_size=drafter_config.vocab_size, embed_size=int(embed_weight.shape[1]),
                          hidden_size=drafter_config.hidden_size, rank=int(spec.get("rank", 64)))
    return DominoHead(config, embed_weight, head_ids)


# Each method's export: (folder, drafter, head or None, dtype, (vocab ids, LM head) or None).
EXPORTERS: dict[str, Callable[..., None]] = {
    "dflash": lambda out, drafter, head, dtype, vocab: export_dflash(out, drafter, dtype, vocab),
    "lilicorr": lambda out, drafter, head, dtype, vocab: export_lilicorr(out, drafter, head, dtype),
    "dspark": export_dspark,
    "domino": export_domino,
}

# Where the frozen target's layer taps come from: computed each step, or read from a cache.
FEATURE_SOURCES: dict[str, Callable[..., Any]] = {
    "online": lambda spec, target, drafter, device, final: OnlineFeatures(
        target, drafter.config.target_layer_ids, final_hidden=final),
    "cached": lambda spec, target, drafter, device, final: CachedFeatures(spec["dir"], device),
}


def target_features(spec: dict[str, Any], target_model, drafter, device, need_final: bool):
    """The recipe's `features` source (FEATURE_SOURCES; "online" when absent)."""
    mode = spec.get("mode", "online")
    if mode not in FEATURE_SOURCES:
        raise ValueError(f"features.mode must be one of {sorted(FEATURE_SOURCES)}, got {mode!r}")
    return FEATURE_SOURCES[mode](spec, target_model, drafter, device, need_final)


@dataclass
class DraftRun:
    """A draft training, built and ready to fit: the trainer, the modules it trains, the
    training vocabulary, and how to export the result."""

    trainer: Trainer
    drafter: DFlashDrafter
    objective: DraftObjective
    export: Callable[[Path], None]
    vocab_ids: torch.Tensor | None


def prepare_draft_training(recipe: dict[str, Any], *, target_model=None, dataset=None,
                           progress: bool = True) -> DraftRun:
    """Build everything a recipe trains (target, data, drafter, head, objective, trainer) without
    training a step. `target_model` / `dataset` may be passed in directly (tests, notebooks, a
    device round); otherwise they are loaded from recipe["target"] / recipe["data"]."""
    method = recipe.get("method")
    if method not in METHODS:
        raise ValueError(f"recipe method must be one of {METHODS}, got {method!r}")
    train_config, env, device = start_run(recipe)
    target_model = load_frozen_target(recipe, device, target_model)
    if dataset is None:
        dataset = TokenizedDataset.load(recipe["data"])

    drafter = build_drafter(recipe.get("drafter", {}), target_model.config).to(device)
    lattice = None
    if method == "lilicorr":
        lattice = build_lattice(recipe.get("lattice", {}), drafter.config).to(device)
    weights = LossWeights(**recipe.get("loss", {}))
    embed_weight, lm_head_weight = frozen_target_weights(target_model)
    if not _uses_autocast(train_config.precision, device):
        # fp32 training multiplies with fp32 weights; under bf16 autocast the target's own
        # (bf16) tables are used as they are, saving two vocabulary-sized fp32 copies.
        embed_weight, lm_head_weight = embed_weight.float(), lm_head_weight.float()
    export_vocab = _export_vocab(recipe, method)
    vocab_ids, extras = None, {}
    if recipe.get("train_vocab"):
        vocab_ids, coverage = training_vocabulary(dataset, drafter.config.vocab_size,
                                                  int(recipe["train_vocab"]["size"]))
        extras["train_vocab"] = {"size": int(vocab_ids.numel()), "supervised_coverage": coverage}
    correction = None
    if method in SEQUENTIAL_HEADS:
        head_ids = vocab_ids if vocab_ids is not None else torch.arange(drafter.config.vocab_size)
        correction = build_sequential_head(method, recipe.get(method, {}), drafter.config,
                                           embed_weight, head_ids.to(device)).to(device)
    objective = DraftObjective(
        drafter, embed_weight, lm_head_weight,
        lattice=lattice, correction=correction, weights=weights, num_anchors=int(recipe.get("num_anchors", 512)),
        vocab_ids=None if vocab_ids is None else vocab_ids.to(device),
    )

    need_final = (lattice is not None and weights.distractor > 0) or weights.distill > 0
    features = target_features(recipe.get("features", {}), target_model, drafter, device, need_final)

    def make_inputs(indices: list[int], epoch: int) -> dict[str, Any]:
        batch = collate([dataset[i] for i in indices], pad_id=0)
        batch = {k: v.to(device) for k, v in batch.items()}
        feats = features(batch)
        return {
            "input_ids": batch["input_ids"],
            "loss_mask": batch["loss_mask"],
            "target_taps": feats["target_taps"],
            "target_final_hidden": feats["target_final_hidden"] if need_final else None,
            "seeds": seeds_for(indices, train_config.seed, epoch),
        }

    trainable = {"drafter": drafter}
    extras.update({"kind": method, "drafter_config": drafter.config.to_dict()})
    if lattice is not None:
        trainable["head"] = lattice
        extras["lattice_config"] = _lattice_config_dict(lattice.config)
    if correction is not None:
        trainable["head"] = correction
        extras["head_recipe"] = dict(recipe.get(method, {}))
    trainer = Trainer(
        objective, trainable, make_inputs, len(dataset), train_config,
        device=device, dist_env=env, checkpoint_extras=extras, progress=progress,
    )

    def export(export_dir: Path) -> None:
        dtype = getattr(torch, recipe.get("export_dtype", "bfloat16"))
        draft_vocab = (vocab_ids, lm_head_weight) if export_vocab == "train" else None
        head = lattice if lattice is not None else correction
        EXPORTERS[method](export_dir, drafter, head, dtype, draft_vocab)

    return DraftRun(trainer, drafter, objective, export, vocab_ids)


def run_draft_training(
    recipe: dict[str, Any],
    *,
    resume: str | bool | None = None,
    target_model=None,
    dataset=None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train per the recipe; returns {"history", "export_dir", "trainer"}.

    `target_model` / `dataset` may be passed in directly (tests, notebooks); otherwise they
    are loaded from recipe["target"] / recipe["data"].
    """
    run = prepare_draft_training(recipe, target_model=target_model, dataset=dataset, progress=progress)
    if resume == "latest":
        resume = True
    history = run.trainer.fit(resume=resume)
    export_dir = Path(recipe["train"]["output_dir"]) / "final"
    if run.trainer.env.is_main:
        run.export(export_dir)
    return {"history": history, "export_dir": export_dir, "trainer": run.trainer}
