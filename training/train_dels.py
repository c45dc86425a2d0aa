"""DeLS-Spec short head training, independent of the target's hidden states and of DFlash.

    python -m training.train_dels --recipe dels_gru_qwen3_8b --set train.output_dir=runs/dels
    python -m training.train_dels --recipe dels_fusion_qwen3_8b   # optional: learn alpha/beta

Stage "head" (method "dels"): next-token CE of the short head on tokenized text.
  gru     the head reads a block-local prefix, exactly as at serving time (recipe field
          pure_draft_prefix_len P, exported into the head's config): for a random anchor a and
          P = 0 it consumes x_a, x_{a+1}, ... from a zero state and predicts x_{a+1}, x_{a+2},
          ... (block_size - 1 predictions per anchor); for P = 1 (DeLS-Spec's own layout: the
          prefix starts at the first drafted token, slot 0 is not corrected) it consumes
          x_{a+1}, ... and predicts x_{a+2}, ... (block_size - 2 per anchor);
  markov  dense supervision: every loss-masked token from its predecessor (the same for either
          P: a bigram head never sees where the block starts).
  The unigram prior counts the loss-masked tokens of the same data (additive smoothing,
  1.0 by default). Exported as a DeLS folder (vllm_liliprop.heads.dels_io) at
  <output_dir>/final.

Stage "fusion" (method "dels_fusion", optional; DeLS Section "learnable alpha/beta"): the
target, a trained DFlash drafter and the short head are frozen; only per-slot alpha[S] and
beta[S] (initialized to 0.3) are trained with the CE of the fused logits
    long + alpha_s * log_softmax(short) - beta_s * log_prior.
The short logits follow the head's serving layout, its folder's pure_draft_prefix_len P: for
P = 0 slot s reads x_a .. x_{a+s}; for P = 1 slot 0 is the drafter's alone (alpha_0 = beta_0 = 0,
never trained) and slot s >= 1 reads x_{a+1} .. x_{a+s}. A drafter exported with a reduced
vocabulary (draft_vocab_size + d2t) is scored over those ids only, as serving does
(long logits, log_softmax of the short ones and the prior over the N ids; labels outside them
are not supervised). The learned schedules are written into the DeLS folder's config as
lists of S entries, entry s for draft slot s (the first P entries 0: what serving applies).

Recipe fields: method, target (tokenizer + embedding table), data, device, head
({"kind", "hidden_size", "rank", "rank_activation"}), prior_smoothing [1.0], block_size [16],
num_anchors [256], pure_draft_prefix_len [0], train (TrainConfig; optim.lr/weight_decay need a "head" entry), and for
fusion: drafter (DFlash dir), dels (DeLS folder; P is read from its config), alpha/beta init [0.3].
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn
from torch.utils.checkpoint import checkpoint

from training.blocks import block_windows, build_blocks, sample_anchors
from training.data import TokenizedDataset, collate
from training.export import dels_checkpoint_info, export_dels, load_dflash, read_draft_vocab
from training.features import OnlineFeatures, frozen_target_weights
from training.objective import vocab_positions
from training.pipeline import load_frozen_target, start_run
from training.recipe import add_recipe_arguments, recipe_from_args
from training.trainer import Trainer, seeds_for
from vllm_liliprop.heads.dels import GRUShortHead, MarkovShortHead, UnigramPrior, check_prefix_len, dels_fuse
from vllm_liliprop.heads.dels_io import load_dels_head, tokenizer_fingerprint
from vllm_liliprop.quiet import add_verbose_flag, quiet_after_parse

__all__ = [
    "ShortHeadObjective",
    "FusionObjective",
    "short_head_windows",
    "build_short_head",
    "run_dels_training",
    "run_fusion_training",
    "load_target_embedding",
]

# Largest number of [rows, V] logits materialized at once; chunks are recomputed in backward.
_ROWS_PER_CHUNK = 4096


def _sum_ce(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    ce = F.cross_entropy(logits.float().flatten(0, -2), labels.clamp(min=0).flatten(), reduction="none")
    return (ce * mask.flatten()).sum()


def short_head_windows(input_ids: torch.Tensor, anchors: torch.Tensor, block_size: int,
                       prefix_len: int) -> torch.Tensor:
    """The block-local prefixes a short head reads at serving time, for teacher forcing:
    [B, N, block_size - 1 - P] tokens at a + P + j. P = 0: the anchor, then the block's true
    tokens (x_a, x_{a+1}, ...); P = 1: the block's tokens without the anchor (x_{a+1}, ...).
    Row j of the head's output (after consuming j + 1 of them) scores draft slot P + j; the
    slots before P are never corrected."""
    return block_windows(input_ids, anchors, block_size - 1 - prefix_len, offset=prefix_len)


class ShortHeadObjective(nn.Module):
    """Next-token CE of a GRU or Markov short head (mean over supervised predictions).

    pure_draft_prefix_len P: the serving layout the GRU is trained for (module docstring)."""

    def __init__(self, head: GRUShortHead | MarkovShortHead, block_size: int = 16, num_anchors: int = 256,
                 pure_draft_prefix_len: int = 0) -> None:
        super().__init__()
        check_prefix_len(pure_draft_prefix_len)
        if block_size < 2 + pure_draft_prefix_len:
            raise ValueError(f"block_size must be >= {2 + pure_draft_prefix_len} for "
                             f"pure_draft_prefix_len = {pure_draft_prefix_len}, got {block_size}")
        self.head = head
        self.block_size = block_size
        self.num_anchors = num_anchors
        self.prefix_len = pure_draft_prefix_len

    def _chunked(self, inputs: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, fn) -> torch.Tensor:
        rows_per_item = max(1, inputs[0].numel())
        step = max(1, _ROWS_PER_CHUNK // rows_per_item)
        total = inputs.new_zeros((), dtype=torch.float32)
        for i in range(0, inputs.shape[0], step):
            piece = (inputs[i:i + step], labels[i:i + step], mask[i:i + step].float())
            if torch.is_grad_enabled():
                total = total + checkpoint(lambda x, y, m: _sum_ce(fn(x), y, m), *piece, use_reentrant=False)
            else:
                total = total + _sum_ce(fn(piece[0]), piece[1], piece[2])
        return total

    def forward(self, input_ids: torch.Tensor, loss_mask: torch.Tensor, seeds: Sequence[int]) -> dict[str, torch.Tensor]:
        loss_mask = loss_mask.bool()
        if isinstance(self.head, MarkovShortHead):
            prev = input_ids[:, :-1]
            labels = input_ids[:, 1:]
            mask = loss_mask[:, 1:]
            prev, labels = prev[mask], labels[mask]
            ones = torch.ones_like(labels, dtype=torch.bool)
            total = self._chunked(prev, labels, ones, self.head.pair_logits)
            count = mask.sum()
        else:
            anchors, valid = sample_anchors(loss_mask, self.num_anchors, seeds)
            _, targets, slot_mask = build_blocks(input_ids, loss_mask, anchors, valid, self.block_size, 0)
            # The head consumes the anchor (P = 0) or the block's first token (P = 1), then the
            # block's true tokens; the slots before P are never corrected, so never trained.
            p = self.prefix_len
            window = short_head_windows(input_ids, anchors, self.block_size, p)
            targets, slot_mask = targets[..., p:], slot_mask[..., p:]
            window, targets, slot_mask = window[valid], targets[valid], slot_mask[valid]
            total = self._chunked(window, targets, slot_mask, self.head)
            count = slot_mask.sum()
        loss = total / count.clamp(min=1)
        return {"loss": loss, "ce": loss.detach(), "supervised": count.float()}

    def loss_for_ranks(self, terms: dict[str, torch.Tensor], mean_over_ranks) -> torch.Tensor:
        return terms["loss"] * terms["supervised"] / mean_over_ranks(terms["supervised"]).clamp(min=1)


class FusionObjective(nn.Module):
    """Learn per-slot alpha/beta with everything else frozen (DeLS, learnable variant).

    pure_draft_prefix_len P: the head's serving layout (its DeLS config). Slot s < P is the
    drafter's alone: its alpha/beta stay 0 and get no gradient. Slot s >= P fuses the head's
    prediction after the block-local prefix `short_head_windows` gives it.
    vocab_ids [N] (target ids, a drafter's reduced vocabulary) or None: every term is
    scored over those ids only, as the serving rule does, and labels outside them are not
    supervised (no draft can propose them)."""

    def __init__(self, drafter, head, prior: UnigramPrior, embed_weight: torch.Tensor,
                 lm_head_weight: torch.Tensor, num_anchors: int = 256, alpha: float = 0.3, beta: float = 0.3,
                 pure_draft_prefix_len: int = 0, vocab_ids: torch.Tensor | None = None) -> None:
        super().__init__()
        check_prefix_len(pure_draft_prefix_len)
        slots = drafter.config.block_size - 1
        if slots <= pure_draft_prefix_len:
            raise ValueError(f"block_size must be >= {2 + pure_draft_prefix_len} for pure_draft_prefix_len "
                             f"= {pure_draft_prefix_len} (a fused slot), got {drafter.config.block_size}")
        self.drafter = drafter.requires_grad_(False)
        self.head = head.requires_grad_(False)
        self.prefix_len = pure_draft_prefix_len
        initial = {}
        for name, value in (("alpha", alpha), ("beta", beta)):
            weights = torch.full((slots,), float(value))
            weights[:pure_draft_prefix_len] = 0.0  # what serving applies there (slot_schedule)
            initial[name] = weights
        self.alpha = nn.Parameter(initial["alpha"])
        self.beta = nn.Parameter(initial["beta"])
        self.num_anchors = num_anchors
        log_prior = prior.log_probs.float()
        if vocab_ids is None:
            self.vocab_ids = self.vocab_position = None
        else:
            vocab_ids, position = vocab_positions(vocab_ids, lm_head_weight.shape[0], lm_head_weight.device)
            self.register_buffer("vocab_ids", vocab_ids, persistent=False)
            self.register_buffer("vocab_position", position, persistent=False)
            lm_head_weight = lm_head_weight[vocab_ids]
            log_prior = log_prior[vocab_ids.to(log_prior.device)]
        self.register_buffer("log_prior", log_prior, persistent=False)
        self.register_buffer("embed_weight", embed_weight.detach(), persistent=False)
        self.register_buffer("lm_head_weight", lm_head_weight.detach(), persistent=False)

    def schedule(self, name: str) -> list[float]:
        """The learned alpha or beta as a DeLS config writes it: S entries, entry s for draft
        slot s, the first P of them 0 (`heads.dels.slot_schedule` zeroes them at serving)."""
        weights = getattr(self, name).detach().float().cpu().clone()
        weights[:self.prefix_len] = 0.0
        return [round(float(w), 6) for w in weights]

    def forward(self, input_ids, loss_mask, target_taps, seeds, target_final_hidden=None) -> dict[str, torch.Tensor]:
        cfg = self.drafter.config
        p = self.prefix_len
        anchors, valid = sample_anchors(loss_mask, self.num_anchors, seeds)
        block_ids, targets, slot_mask = build_blocks(input_ids, loss_mask, anchors, valid, cfg.block_size, cfg.mask_token_id)
        with torch.no_grad():
            context = self.drafter.context_states(target_taps.to(self.drafter.fc.weight.dtype))
            hidden = self.drafter(F.embedding(block_ids, self.embed_weight), context, anchors)
            long_logits = F.linear(hidden[:, :, 1:][valid], self.lm_head_weight).float()
            window = short_head_windows(input_ids, anchors, cfg.block_size, p)
            short_logits = self.head(window[valid]).float()  # row j scores slot p + j
            if self.vocab_ids is not None:
                short_logits = short_logits[..., self.vocab_ids]
        targets, slot_mask = targets[valid], slot_mask[valid]
        if self.vocab_ids is not None:
            targets = torch.where(targets >= 0, self.vocab_position[targets.clamp(min=0)], targets)
            slot_mask = slot_mask & (targets >= 0)
        # Slots < p are the drafter's alone, as served: no alpha/beta term, so no gradient.
        fused = dels_fuse(long_logits[:, p:], short_logits, self.log_prior, self.alpha[p:], self.beta[p:])
        if p:
            fused = torch.cat([long_logits[:, :p], fused], dim=1)
        total = _sum_ce(fused, targets, slot_mask.float())
        count = slot_mask.sum()
        loss = total / count.clamp(min=1)
        with torch.no_grad():
            long_ce = _sum_ce(long_logits, targets, slot_mask.float()) / count.clamp(min=1)
        fitted = slice(p, None)
        return {"loss": loss, "ce": loss.detach(), "long_only_ce": long_ce, "supervised": count.float(),
                "alpha_mean": self.alpha.detach()[fitted].mean(), "beta_mean": self.beta.detach()[fitted].mean()}

    def loss_for_ranks(self, terms, mean_over_ranks) -> torch.Tensor:
        return terms["loss"] * terms["supervised"] / mean_over_ranks(terms["supervised"]).clamp(min=1)


def build_short_head(spec: dict[str, Any], vocab_size: int, embed_weight: torch.Tensor | None):
    spec = dict(spec)
    kind = spec.pop("kind", "gru")
    if kind == "markov":
        unknown = set(spec) - {"rank"}
        if unknown:
            raise ValueError(f"unknown head fields {sorted(unknown)} for kind 'markov' (known: rank)")
        return MarkovShortHead(vocab_size, int(spec.get("rank", 256)))
    if kind != "gru":
        raise ValueError(f"head.kind must be 'gru' or 'markov', got {kind!r}")
    unknown = set(spec) - {"hidden_size", "rank", "rank_activation"}
    if unknown:
        raise ValueError(f"unknown head fields {sorted(unknown)} for kind 'gru' (known: hidden_size, rank, rank_activation)")
    if embed_weight is None:
        raise ValueError("a GRU head reads the target's embedding table; the recipe needs a target")
    return GRUShortHead(embed_weight.float(), int(spec.get("hidden_size", 1024)), int(spec.get("rank", 256)),
                        spec.get("rank_activation", "silu"))


def load_target_embedding(target: str) -> torch.Tensor:
    """The target's input embedding table [V, D], read alone from its safetensors (no model)."""
    root = Path(target)
    if not root.is_dir():
        from huggingface_hub import snapshot_download

        root = Path(snapshot_download(target, allow_patterns=["*.json"]))
        index = root / "model.safetensors.index.json"
        names = (json.loads(index.read_text())["weight_map"] if index.exists() else None)
        from huggingface_hub import hf_hub_download

        key = _embedding_key(names.keys() if names else None)
        file = names[key] if names else "model.safetensors"
        return _read_tensor(Path(hf_hub_download(target, file)), key, safe_open)
    index = root / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        key = _embedding_key(weight_map.keys())
        return _read_tensor(root / weight_map[key], key, safe_open)
    file = root / "model.safetensors"
    if not file.exists():
        raise ValueError(f"{root} has no model.safetensors(.index.json); pass a safetensors target")
    with safe_open(str(file), "pt") as f:
        key = _embedding_key(f.keys())
    return _read_tensor(file, key, safe_open)


def _embedding_key(names) -> str:
    names = list(names) if names is not None else ["model.embed_tokens.weight"]
    for key in ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight", "embed_tokens.weight"):
        if key in names:
            return key
    raise ValueError("the target's weights have no embed_tokens.weight; is it a Qwen3/Llama-style model?")


def _read_tensor(file: Path, key: str, safe_open) -> torch.Tensor:
    with safe_open(str(file), "pt") as f:
        return f.get_tensor(key)


def run_dels_training(recipe: dict[str, Any], *, resume=None, embed_weight: torch.Tensor | None = None,
                      dataset=None, tokenizer=None, progress: bool = True) -> dict[str, Any]:
    """Train a short head per the recipe; returns {"history", "export_dir", "trainer", "prior"}."""
    train_config, env, device = start_run(recipe)
    if dataset is None:
        dataset = TokenizedDataset.load(recipe["data"])
    head_spec = recipe.get("head", {"kind": "gru"})
    if embed_weight is None and head_spec.get("kind", "gru") == "gru":
        embed_weight = load_target_embedding(recipe["target"])
    if tokenizer is None and recipe.get("target"):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(recipe["target"])
    vocab_size = int(recipe.get("vocab_size") or (embed_weight.shape[0] if embed_weight is not None else len(tokenizer)))
    head = build_short_head(head_spec, vocab_size, embed_weight).to(device)
    prior = UnigramPrior.from_counts(dataset.supervised_token_counts(vocab_size),
                                     float(recipe.get("prior_smoothing", 1.0)))
    prefix_len = int(recipe.get("pure_draft_prefix_len", 0))
    objective = ShortHeadObjective(head, int(recipe.get("block_size", 16)), int(recipe.get("num_anchors", 256)),
                                   prefix_len)

    def make_inputs(indices: list[int], epoch: int) -> dict[str, Any]:
        batch = collate([dataset[i] for i in indices])
        return {"input_ids": batch["input_ids"].to(device), "loss_mask": batch["loss_mask"].to(device),
                "seeds": seeds_for(indices, train_config.seed, epoch)}

    fingerprint = tokenizer_fingerprint(tokenizer) if tokenizer is not None else None
    trainer = Trainer(objective, {"head": head}, make_inputs, len(dataset), train_config, device=device,
                      dist_env=env, checkpoint_extras={"kind": "dels", "dels": dels_checkpoint_info(head, prior, fingerprint, prefix_len)},
                      progress=progress)
    history = trainer.fit(resume=True if resume == "latest" else resume)
    export_dir = Path(train_config.output_dir) / "final"
    if env.is_main:
        export_dels(export_dir, head, prior, tokenizer_fingerprint=fingerprint,
                    alpha=recipe.get("alpha", 0.3), beta=recipe.get("beta", 0.3),
                    pure_draft_prefix_len=prefix_len)
    return {"history": history, "export_dir": export_dir, "trainer": trainer, "prior": prior}


def run_fusion_training(recipe: dict[str, Any], *, resume=None, target_model=None, dataset=None,
                        progress: bool = True) -> dict[str, Any]:
    """Fit per-slot alpha/beta; writes them into the DeLS folder's config.json (a copy at
    <output_dir>/final). Returns {"history", "alpha", "beta", "export_dir", "trainer"}."""
    train_config, env, device = start_run(recipe)
    target_model = load_frozen_target(recipe, device, target_model)
    if dataset is None:
        dataset = TokenizedDataset.load(recipe["data"])
    embed_weight, lm_head_weight = frozen_target_weights(target_model)
    drafter = load_dflash(recipe["drafter"]).to(device)
    head, prior, config = load_dels_head(recipe["dels"], embed_weight.float(), drafter.config.vocab_size)
    # The layout the head serves with (the field the serving rule reads), and the drafter's
    # reduced vocabulary if it was exported with one: alpha/beta are fitted to what is served.
    vocab_ids = read_draft_vocab(recipe["drafter"])
    objective = FusionObjective(drafter, head.to(device).float(), prior.to(device), embed_weight.float(),
                                lm_head_weight.float(), int(recipe.get("num_anchors", 256)),
                                recipe.get("alpha", 0.3), recipe.get("beta", 0.3),
                                config.pure_draft_prefix_len,
                                None if vocab_ids is None else vocab_ids.to(device))
    features = OnlineFeatures(target_model, drafter.config.target_layer_ids, final_hidden=False)

    def make_inputs(indices: list[int], epoch: int) -> dict[str, Any]:
        batch = {k: v.to(device) for k, v in collate([dataset[i] for i in indices]).items()}
        return {"input_ids": batch["input_ids"], "loss_mask": batch["loss_mask"],
                "target_taps": features(batch)["target_taps"],
                "seeds": seeds_for(indices, train_config.seed, epoch)}

    fusion = nn.ParameterDict({"alpha": objective.alpha, "beta": objective.beta})
    trainer = Trainer(objective, {"head": fusion}, make_inputs, len(dataset), train_config, device=device,
                      dist_env=env, checkpoint_extras={"kind": "dels_fusion"}, progress=progress)
    history = trainer.fit(resume=True if resume == "latest" else resume)
    alpha, beta = objective.schedule("alpha"), objective.schedule("beta")
    export_dir = Path(train_config.output_dir) / "final"
    if env.is_main:
        if export_dir.exists():
            shutil.rmtree(export_dir)
        shutil.copytree(recipe["dels"], export_dir)
        config_path = export_dir / "config.json"
        config = json.loads(config_path.read_text())
        config.update(alpha=alpha, beta=beta)
        config_path.write_text(json.dumps(config, indent=2) + "\n")
    return {"history": history, "alpha": alpha, "beta": beta, "export_dir": export_dir, "trainer": trainer}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m training.train_dels", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_recipe_arguments(parser)
    add_verbose_flag(parser)
    args = parser.parse_args(argv)
    quiet_after_parse(args)  # libraries at WARNING unless --verbose
    recipe = recipe_from_args(args)
    if args.print_recipe:
        print(json.dumps(recipe, indent=2))
        return
    method = recipe.get("method", "dels")
    if method == "dels":
        result = run_dels_training(recipe, resume=args.resume)
    elif method == "dels_fusion":
        result = run_fusion_training(recipe, resume=args.resume)
        print(f"alpha = {result['alpha']}\nbeta = {result['beta']}")
    else:
        raise ValueError(f"recipe method must be 'dels' or 'dels_fusion' for training.train_dels, got {method!r}")
    print(f"exported {result['export_dir']}")


if __name__ == "__main__":
    main()
