"""Frozen-target features for drafter training: hidden states at target_layer_ids (+ final).

vLLM's definition, which training must match: target layer id i is the *output* of decoder
layer i (the residual stream after that layer, before any final norm), and the drafter's fc
reads these states concatenated in ascending layer order. We capture them with forward hooks
on the decoder layers of a transformers model; `output_hidden_states` is not used because its
last entry is the final-normed state, which differs from vLLM's aux state for the last layer.

The final hidden state (after the model's final norm) is kept when the distractor penalty
needs the target distribution: the frozen LM head turns it back into logits only at the
positions a batch needs, which is far cheaper to store than [T, V] logits.

Two providers share one call signature, `provider(batch) -> dict` with `target_taps`
[B, T, H * n] and `target_final_hidden` [B, T, H] or None:
  OnlineFeatures  runs the target on each batch;
  CachedFeatures  reads what `cache_features` wrote (one safetensors file per example).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm import tqdm

from training.data import TokenizedDataset, collate
from vllm_liliprop.quiet import add_verbose_flag, quiet_after_parse

__all__ = [
    "decoder_layers",
    "target_hidden_states",
    "OnlineFeatures",
    "CachedFeatures",
    "cache_features",
    "frozen_target_weights",
]


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layer list of a transformers causal LM (Qwen3/Llama style `model.layers`)."""
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(model).__name__} has no `model.layers`; pass a decoder-only causal LM")
    return layers


def frozen_target_weights(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """(input embedding [V, H], LM head [V, H]) of the target, detached."""
    embed = model.get_input_embeddings().weight.detach()
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output embeddings (LM head)")
    return embed, head.weight.detach()


@torch.no_grad()
def target_hidden_states(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    target_layer_ids: Sequence[int],
    final_hidden: bool = True,
) -> dict[str, torch.Tensor | None]:
    """Run the frozen target once. input_ids, attention_mask [B, T] (right padding).

    Returns target_taps [B, T, H * len(ids)] (target dtype; layer blocks in ascending id
    order) and target_final_hidden [B, T, H] or None.
    """
    layers = decoder_layers(model)
    ids = list(target_layer_ids)
    if ids != sorted(set(ids)) or not ids or ids[0] < 0 or ids[-1] >= len(layers):
        raise ValueError(f"target_layer_ids {ids} must be strictly increasing ids in [0, {len(layers)})")
    captured: dict[int, torch.Tensor] = {}

    def hook(index):
        def save(_module, _inputs, output):
            captured[index] = output[0] if isinstance(output, tuple) else output
        return save

    handles = [layers[i].register_forward_hook(hook(i)) for i in ids]
    try:
        out = model.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    taps = torch.cat([captured[i] for i in ids], dim=-1)
    return {
        "target_taps": taps,
        "target_final_hidden": out.last_hidden_state if final_hidden else None,
    }


class OnlineFeatures:
    """Computes features on the fly with a frozen transformers target (eval mode, no grad)."""

    def __init__(self, model: nn.Module, target_layer_ids: Sequence[int], final_hidden: bool = True) -> None:
        self.model = model.eval().requires_grad_(False)
        self.target_layer_ids = list(target_layer_ids)
        self.final_hidden = final_hidden

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor | None]:
        return target_hidden_states(
            self.model, batch["input_ids"], batch["attention_mask"], self.target_layer_ids, self.final_hidden
        )


def _feature_path(cache_dir: Path, example_index: int) -> Path:
    return cache_dir / f"{example_index // 10000:04d}" / f"{example_index:08d}.safetensors"


class CachedFeatures:
    """Reads features written by `cache_features`, padded to the batch's length."""

    def __init__(self, cache_dir: str | Path, device: torch.device | str = "cpu") -> None:
        self.cache_dir = Path(cache_dir)
        if not self.cache_dir.is_dir():
            raise ValueError(f"feature cache {self.cache_dir} does not exist; run `python -m training.features` first")
        self.device = torch.device(device)

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor | None]:
        length = batch["input_ids"].shape[1]
        taps, finals = [], []
        for index in batch["example_index"].tolist():
            path = _feature_path(self.cache_dir, index)
            if not path.exists():
                raise ValueError(f"no cached features for example {index} at {path}; re-run feature caching")
            tensors = load_file(str(path))
            taps.append(_pad_rows(tensors["target_taps"], length))
            if "target_final_hidden" in tensors:
                finals.append(_pad_rows(tensors["target_final_hidden"], length))
        final = torch.stack(finals).to(self.device) if len(finals) == len(taps) else None
        return {"target_taps": torch.stack(taps).to(self.device), "target_final_hidden": final}


def _pad_rows(x: torch.Tensor, length: int) -> torch.Tensor:
    if x.shape[0] > length:
        raise ValueError(f"cached features have {x.shape[0]} rows but the batch is {length} long")
    return torch.cat([x, x.new_zeros(length - x.shape[0], *x.shape[1:])]) if x.shape[0] < length else x


@torch.no_grad()
def cache_features(
    model: nn.Module,
    dataset,
    cache_dir: str | Path,
    target_layer_ids: Sequence[int],
    *,
    final_hidden: bool = True,
    batch_size: int = 4,
    dtype: torch.dtype = torch.bfloat16,
    progress: bool = True,
) -> int:
    """Write one safetensors file per example (skipping files that exist: resumable).

    `dataset` is a training.data.TokenizedDataset. Returns the number of files written.
    """
    cache_dir = Path(cache_dir)
    todo = [i for i in range(len(dataset)) if not _feature_path(cache_dir, i).exists()]
    device = next(model.parameters()).device
    written = 0
    for start in tqdm(range(0, len(todo), batch_size), disable=not progress, desc="features"):
        indices = todo[start:start + batch_size]
        batch = collate([dataset[i] for i in indices], pad_id=0)
        feats = target_hidden_states(
            model, batch["input_ids"].to(device), batch["attention_mask"].to(device),
            target_layer_ids, final_hidden,
        )
        for row, index in enumerate(indices):
            length = int(batch["attention_mask"][row].sum())
            tensors = {"target_taps": feats["target_taps"][row, :length].to(dtype).cpu().contiguous()}
            if final_hidden:
                tensors["target_final_hidden"] = (
                    feats["target_final_hidden"][row, :length].to(dtype).cpu().contiguous()
                )
            path = _feature_path(cache_dir, index)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            save_file(tensors, str(tmp))
            tmp.replace(path)  # atomic: an interrupted run never leaves a truncated file
            written += 1
    return written


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m training.features",
        description="Cache frozen-target hidden states (target_layer_ids taps + final hidden) to disk.",
    )
    parser.add_argument("--target", required=True, help="target model (HF id or local dir)")
    parser.add_argument("--data", required=True, help="tokenized dataset (.jsonl from `python -m training.data`)")
    parser.add_argument("--out", required=True, help="cache directory")
    parser.add_argument("--target-layer-ids", required=True, type=lambda s: [int(x) for x in s.split(",")],
                        help="comma-separated target layer ids, e.g. 1,9,17,25,33")
    parser.add_argument("--no-final-hidden", action="store_true", help="skip the final hidden state (no distractor)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_verbose_flag(parser)
    args = parser.parse_args(argv)
    quiet_after_parse(args)  # libraries at WARNING unless --verbose

    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).to(args.device)
    count = cache_features(
        model, TokenizedDataset.load(args.data), args.out, args.target_layer_ids,
        final_hidden=not args.no_final_hidden, batch_size=args.batch_size, dtype=dtype,
    )
    print(f"wrote {count} feature files to {args.out}")


if __name__ == "__main__":
    main()
