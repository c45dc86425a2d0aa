"""Write trained drafts in the formats vLLM 0.32 loads.

DFlash draft directory (`DFlashDraftModel`, served by vLLM's DFlash proposer):
  config.json        Qwen3 config, architectures ["DFlashDraftModel"], dflash_config with
                     mask_token_id, target_layer_ids, block_size;
  model.safetensors  the drafter's weights under vLLM's names (fc, hidden_norm, norm,
                     layers.i.*); embed_tokens and lm_head omitted (shared from the target).
  With a draft vocabulary (upstream's reduced-vocabulary convention, as for EAGLE-3):
  config.json also has draft_vocab_size = N, and model.safetensors has lm_head.weight [N, H]
  (the target's LM head rows of those ids) and d2t [N] int64, the offset from draft id i to
  its target id (target = i + d2t[i]). vLLM's compute_logits scatters the N logits into the
  full vocabulary (-inf elsewhere), so every rule sees target ids.

LiLiCorr draft directory (upstream `LiLiCorrDraftModel`):
  the same backbone, architectures ["LiLiCorrDraftModel"], dflash_config extended with the
  lilicorr_* fields (LatticeConfig.to_dflash_config), head weights under `lilicorr.`.

DSpark draft directory (upstream `Qwen3DSparkModel`, vLLM 0.32 qwen3_dspark.py):
  the same backbone, architectures ["Qwen3DSparkModel"], markov_rank and sample_from_anchor
  (false: the drafter is trained in DFlash's 1 + N fill-in layout, which upstream serves too),
  the Markov head under `markov_head.` (markov_w1 [V, r], markov_w2 [draft_vocab_size, r]).

Domino draft directory: a DFlash directory whose dflash_config.liliprop names the rule
("domino") and a `domino/` folder (vllm_liliprop.heads.domino format) with the head.

DeLS short head: a `dels/` folder (vllm_liliprop.heads.dels_io format) inside a draft dir.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.drafter import DFlashDrafter, DrafterConfig
from vllm_liliprop.checkpoints import read_checkpoint, write_checkpoint
from vllm_liliprop.heads.dels import GRUShortHead, MarkovShortHead, UnigramPrior
from vllm_liliprop.heads.dels_io import DelsConfig, head_structure, load_dels_head, save_dels_head
from vllm_liliprop.heads.domino import DOMINO_SUBFOLDER, DominoHead, load_domino_head, save_domino_head
from vllm_liliprop.heads.dspark import MARKOV_PREFIX, MarkovBiasHead
from vllm_liliprop.heads.lattice import LatticeConfig, LatticeHead
from vllm_liliprop.quiet import add_verbose_flag, quiet_after_parse

__all__ = [
    "export_dflash",
    "export_lilicorr",
    "export_dels",
    "export_dspark",
    "export_domino",
    "load_dflash",
    "load_lilicorr",
    "load_dspark",
    "load_domino",
    "draft_vocab_tensors",
    "read_draft_vocab",
    "export_checkpoint",
]

LILICORR_PREFIX = "lilicorr."


def export_dflash(out_dir: str | Path, drafter: DFlashDrafter, dtype: torch.dtype = torch.bfloat16,
                  draft_vocab: tuple[torch.Tensor, torch.Tensor] | None = None) -> Path:
    """A `DFlashDraftModel` directory vLLM's DFlash proposer loads. `draft_vocab` = (target ids
    [N], target LM head [V, H]) restricts its LM head to those ids (a cheaper draft step: the
    head reads N rows instead of V)."""
    config, tensors = drafter.config.to_hf_dict(), dict(drafter.state_dict())
    if draft_vocab is not None:
        ids, lm_head = draft_vocab
        config["draft_vocab_size"] = int(ids.numel())
        tensors.update(draft_vocab_tensors(ids, lm_head))
    return write_checkpoint(Path(out_dir), config, tensors, dtype)


def draft_vocab_tensors(ids: torch.Tensor, lm_head: torch.Tensor) -> dict[str, torch.Tensor]:
    """lm_head.weight and d2t of a reduced draft vocabulary. The ids must be strictly
    increasing: vLLM's argmax over the scattered logits then breaks ties as the draft-vocab
    argmax does (lowest id first)."""
    ids = ids.to(torch.int64).cpu()
    if ids.dim() != 1 or ids.numel() == 0 or bool((ids[1:] <= ids[:-1]).any()):
        raise ValueError("draft vocabulary ids must be a non-empty, strictly increasing 1-D tensor")
    if int(ids[0]) < 0 or int(ids[-1]) >= lm_head.shape[0]:
        raise ValueError(f"draft vocabulary ids must lie in [0, {lm_head.shape[0]})")
    return {"lm_head.weight": lm_head.detach().cpu()[ids], "d2t": ids - torch.arange(ids.numel())}


def read_draft_vocab(model_dir: str | Path) -> torch.Tensor | None:
    """The target ids [N] of a draft's reduced vocabulary (from d2t), None for a full one."""
    config, tensors = read_checkpoint(Path(model_dir))
    if "d2t" not in tensors:
        return None
    d2t = tensors["d2t"].to(torch.int64)
    if int(config.get("draft_vocab_size", -1)) != d2t.numel():
        raise ValueError(f"{model_dir}: d2t has {d2t.numel()} entries but config.json "
                         f"draft_vocab_size = {config.get('draft_vocab_size')}; re-export the draft")
    return torch.arange(d2t.numel()) + d2t


def export_lilicorr(
    out_dir: str | Path,
    drafter: DFlashDrafter,
    lattice: LatticeHead,
    dtype: torch.dtype = torch.bfloat16,
) -> Path:
    """An upstream-format `LiLiCorrDraftModel` directory (backbone + `lilicorr.` head)."""
    cfg, lat = drafter.config, lattice.config
    if lat.block_size != cfg.block_size or lat.model_hidden_size != cfg.hidden_size:
        raise ValueError(
            f"lattice (block_size {lat.block_size}, model_hidden_size {lat.model_hidden_size}) does not "
            f"match the drafter (block_size {cfg.block_size}, hidden_size {cfg.hidden_size})"
        )
    config = cfg.to_hf_dict(architectures=["LiLiCorrDraftModel"])
    config["dflash_config"] = {**config["dflash_config"], **lat.to_dflash_config()}
    tensors = dict(drafter.state_dict())
    tensors.update({LILICORR_PREFIX + name: t for name, t in lattice.state_dict().items()})
    return write_checkpoint(Path(out_dir), config, tensors, dtype)


def export_dspark(out_dir: str | Path, drafter: DFlashDrafter, markov: MarkovBiasHead,
                  dtype: torch.dtype = torch.bfloat16,
                  draft_vocab: tuple[torch.Tensor, torch.Tensor] | None = None) -> Path:
    """An upstream-format `Qwen3DSparkModel` directory. `draft_vocab` as for `export_dflash`;
    markov_w2 must have one row per draft id (the target's vocabulary without one)."""
    cfg = drafter.config
    rows = cfg.vocab_size if draft_vocab is None else int(draft_vocab[0].numel())
    if markov.markov_w2.weight.shape[0] != rows or markov.markov_w1.weight.shape[0] != cfg.vocab_size:
        raise ValueError(f"markov_w1 {tuple(markov.markov_w1.weight.shape)} / markov_w2 "
                         f"{tuple(markov.markov_w2.weight.shape)} do not fit a draft of vocab_size "
                         f"{cfg.vocab_size} and draft_vocab_size {rows}")
    config = cfg.to_hf_dict(architectures=["Qwen3DSparkModel"])
    config.update({"markov_rank": int(markov.markov_w1.weight.shape[1]), "sample_from_anchor": False})
    tensors = dict(drafter.state_dict())
    tensors.update({MARKOV_PREFIX + name: t for name, t in markov.state_dict().items()})
    if draft_vocab is not None:
        config["draft_vocab_size"] = rows
        tensors.update(draft_vocab_tensors(*draft_vocab))
    return write_checkpoint(Path(out_dir), config, tensors, dtype)


def export_domino(out_dir: str | Path, drafter: DFlashDrafter, domino: DominoHead,
                  dtype: torch.dtype = torch.bfloat16,
                  draft_vocab: tuple[torch.Tensor, torch.Tensor] | None = None) -> Path:
    """A DFlash directory served by the `domino` rule, with the head in `domino/`."""
    out_dir = Path(out_dir)
    export_dflash(out_dir, drafter, dtype, draft_vocab)
    config_path = out_dir / "config.json"
    config = json.loads(config_path.read_text())
    config["dflash_config"]["liliprop"] = {"rule": "domino", "domino_path": DOMINO_SUBFOLDER}
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    save_domino_head(out_dir / DOMINO_SUBFOLDER, domino, dtype)
    return out_dir


def export_dels(out_dir: str | Path, head: nn.Module, prior, **config_fields) -> Path:
    """A DeLS head folder (config.json + model.safetensors incl. the unigram prior)."""
    return save_dels_head(out_dir, head, prior, DelsConfig.for_head(head, prior, **config_fields))


def dels_checkpoint_info(head, prior: UnigramPrior, fingerprint: str | None,
                         pure_draft_prefix_len: int = 0) -> dict[str, Any]:
    """What a "dels" training checkpoint keeps of its head and prior (`rebuild_dels_head` reads
    it back): the structure, the prior's log-probabilities, the tokenizer fingerprint and the
    serving layout the head was trained for."""
    return {**head_structure(head), "prior_log_probs": prior.log_probs.tolist(),
            "prior_smoothing": prior.smoothing, "tokenizer_fingerprint": fingerprint,
            "pure_draft_prefix_len": pure_draft_prefix_len}


def rebuild_dels_head(state: dict) -> tuple[nn.Module, UnigramPrior, dict[str, Any]]:
    """(head, prior, DelsConfig fields) from a "dels" training checkpoint, for export."""
    info = state["dels"]
    if info["kind"] == "markov":
        head = MarkovShortHead(info["vocab_size"], info["rank"])
    else:
        # The embedding table is the target's and is not exported; a placeholder of the right
        # shape stands in for it.
        head = GRUShortHead(torch.zeros(info["vocab_size"], info["embed_dim"]), info["hidden_size"],
                            info["rank"], info["rank_activation"])
    head.load_state_dict(state["modules"]["head"])
    prior = UnigramPrior(torch.tensor(info["prior_log_probs"]), info["prior_smoothing"])
    # Checkpoints written before the field existed were all trained for P = 0.
    return head, prior, {"tokenizer_fingerprint": info.get("tokenizer_fingerprint"),
                         "pure_draft_prefix_len": int(info.get("pure_draft_prefix_len", 0))}


def resave_dels(source: str | Path, destination: str | Path, embed: torch.Tensor, dtype: torch.dtype) -> Path:
    """Re-save an exported DeLS folder with its head weights in `dtype` (the unigram prior stays
    fp32: low-precision log-probabilities of rare tokens would lose their order)."""
    head, prior, config = load_dels_head(source, embed, embed.shape[0])
    return save_dels_head(destination, head.to(dtype), prior, config)


def load_dflash(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> DFlashDrafter:
    """Load a DFlash (or the backbone of a LiLiCorr) draft directory for further training."""
    config, tensors = read_checkpoint(Path(model_dir))
    drafter = DFlashDrafter(DrafterConfig.from_hf_dict(config))
    backbone = {k.removeprefix("model."): v for k, v in tensors.items()
                if not k.startswith((LILICORR_PREFIX, MARKOV_PREFIX)) and "embed_tokens" not in k
                and "lm_head" not in k
                and k != "d2t"}
    drafter.load_state_dict(backbone, strict=True)
    return drafter.to(dtype)


def load_lilicorr(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> tuple[DFlashDrafter, LatticeHead]:
    """Load an upstream-format LiLiCorr draft directory (backbone and head)."""
    model_dir = Path(model_dir)
    config, tensors = read_checkpoint(model_dir)
    drafter = load_dflash(model_dir, dtype)
    dcfg = drafter.config
    lattice = LatticeHead(LatticeConfig.from_dflash_config(
        config["dflash_config"], dcfg.hidden_size, dcfg.block_size, dcfg.rms_norm_eps
    ))
    head = {k[len(LILICORR_PREFIX):]: v for k, v in tensors.items() if k.startswith(LILICORR_PREFIX)}
    lattice.load_state_dict(head, strict=True)
    return drafter, lattice.to(dtype)


def load_dspark(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> tuple[DFlashDrafter, MarkovBiasHead]:
    """Load an upstream-format DSpark draft directory (backbone and Markov head)."""
    config, tensors = read_checkpoint(Path(model_dir))
    head = {k.removeprefix("model.")[len(MARKOV_PREFIX):]: v for k, v in tensors.items()
            if k.removeprefix("model.").startswith(MARKOV_PREFIX)}
    markov = MarkovBiasHead.from_state_dict(head, float(config.get("logit_scale", 1.0)))
    return load_dflash(model_dir, dtype), markov.to(dtype)


def load_domino(model_dir: str | Path, embed_weight: torch.Tensor,
                dtype: torch.dtype = torch.float32) -> tuple[DFlashDrafter, DominoHead]:
    """Load a Domino draft directory (backbone and the domino/ head over `embed_weight`)."""
    head = load_domino_head(Path(model_dir) / DOMINO_SUBFOLDER, embed_weight, dtype=dtype)
    return load_dflash(model_dir, dtype), head


def export_checkpoint(checkpoint: str | Path, out_dir: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Export a training checkpoint (written by training.train_*) as a servable directory.

    The kind is read from the checkpoint: "dflash" -> DFlash dir, "lilicorr" -> LiLiCorr dir,
    "dels" -> DeLS head folder.
    """
    path = Path(checkpoint)
    file = path / "state.pt" if path.is_dir() else path
    if not file.exists():
        raise ValueError(f"no checkpoint at {file}")
    state = torch.load(file, map_location="cpu", weights_only=False)
    kind = state.get("kind")
    modules = state["modules"]
    if kind == "dels":
        head, prior, fields = rebuild_dels_head(state)
        return export_dels(out_dir, head, prior, **fields)
    if kind in ("dspark", "domino"):
        raise ValueError(f"{file} is a {kind} checkpoint: its head and reduced vocabulary are "
                         "exported by the training run itself (<train.output_dir>/final); rerun "
                         "the recipe with --resume to export from its last checkpoint")
    if kind not in ("dflash", "lilicorr"):
        raise ValueError(f"{file} has kind {kind!r}; it was not written by a training.train_* command")
    drafter = DFlashDrafter(DrafterConfig.from_dict(state["drafter_config"]))
    drafter.load_state_dict(modules["drafter"])
    if kind == "lilicorr":
        lattice = LatticeHead(LatticeConfig(**state["lattice_config"]))
        lattice.load_state_dict(modules["head"])
        return export_lilicorr(out_dir, drafter, lattice, dtype)
    return export_dflash(out_dir, drafter, dtype)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m training.export",
        description="Export a training checkpoint (state.pt) as a vLLM-loadable draft directory "
                    "(DFlashDraftModel, LiLiCorrDraftModel, or a DeLS head folder).",
    )
    parser.add_argument("--checkpoint", required=True, help="checkpoint dir (.../checkpoints/step_N) or its state.pt")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    add_verbose_flag(parser)
    args = parser.parse_args(argv)
    quiet_after_parse(args)  # libraries at WARNING unless --verbose
    out = export_checkpoint(args.checkpoint, args.out, getattr(torch, args.dtype))
    print(f"exported {out}")


if __name__ == "__main__":
    main()
