"""The files of a draft checkpoint directory, config.json and model.safetensors, as vLLM loads
them: training's exporters and the test fixtures write through `write_checkpoint`."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

WEIGHTS_NAME = "model.safetensors"
DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def dflash_weight_shapes(hidden: int, intermediate: int, num_layers: int, num_heads: int,
                         num_kv_heads: int, head_dim: int, num_taps: int) -> dict[str, tuple[int, ...]]:
    """The tensors of a DFlash draft checkpoint under vLLM's `DFlashDraftModel` names (the
    embeddings and LM head are the target's, omitted) and their shapes; the 1-D ones are norms.
    training.drafter.DFlashDrafter's state dict has exactly these (tests/test_training_drafter.py)."""
    shapes = {"fc.weight": (hidden, hidden * num_taps), "hidden_norm.weight": (hidden,),
              "norm.weight": (hidden,)}
    for i in range(num_layers):
        p = f"layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (num_heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": (num_kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": (num_kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": (hidden, num_heads * head_dim),
            p + "self_attn.q_norm.weight": (head_dim,),
            p + "self_attn.k_norm.weight": (head_dim,),
            p + "mlp.gate_proj.weight": (intermediate, hidden),
            p + "mlp.up_proj.weight": (intermediate, hidden),
            p + "mlp.down_proj.weight": (hidden, intermediate),
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
        })
    return shapes


def dflash_hf_config(*, vocab_size: int, hidden_size: int, intermediate_size: int, num_hidden_layers: int,
                     num_attention_heads: int, num_key_value_heads: int, head_dim: int, rms_norm_eps: float,
                     rope_theta: float, max_position_embeddings: int, mask_token_id: int,
                     target_layer_ids: list[int], block_size: int, hidden_act: str = "silu",
                     architectures: list[str] | None = None) -> dict:
    """The config.json of a DFlash draft as vLLM's `DFlashDraftModel` reads it: a Qwen3 config
    plus `block_size` and `dflash_config` (mask token, target taps, block size)."""
    return {
        "architectures": architectures or ["DFlashDraftModel"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "head_dim": head_dim,
        "hidden_act": hidden_act,
        "rms_norm_eps": rms_norm_eps,
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "max_position_embeddings": max_position_embeddings,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "block_size": block_size,
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": list(target_layer_ids),
                          "block_size": block_size},
    }


def write_checkpoint(out_dir: str | Path, config: dict, tensors: dict[str, torch.Tensor],
                     dtype: torch.dtype) -> Path:
    """config.json (with the weights' dtype named) and model.safetensors (floating tensors in
    `dtype`) in out_dir."""
    out_dir = Path(out_dir)
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"dtype must be one of {list(DTYPE_NAMES.values())}, got {dtype}")
    out_dir.mkdir(parents=True, exist_ok=True)
    config = {**config, "torch_dtype": DTYPE_NAMES[dtype], "dtype": DTYPE_NAMES[dtype]}
    # Only weights take the export dtype: an integer table (d2t) in bf16 would round every
    # offset above 256, sending drafts to the wrong target ids.
    weights = {name: t.detach().to("cpu", dtype if t.is_floating_point() else t.dtype).contiguous()
               for name, t in tensors.items()}
    save_file(weights, str(out_dir / WEIGHTS_NAME), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


def read_checkpoint(model_dir: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json, every tensor of the folder's .safetensors files)."""
    model_dir = Path(model_dir)
    config_path = model_dir / "config.json"
    if not config_path.exists():
        raise ValueError(f"{model_dir} has no config.json; pass a draft model directory")
    config = json.loads(config_path.read_text())
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir} has no .safetensors weights")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(str(file)))
    return config, tensors
