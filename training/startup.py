"""How every training run starts: its TrainConfig, the distributed environment, the device and,
for the methods that read the target's states, the frozen target."""

from __future__ import annotations

from typing import Any

import torch

from training.trainer import DistEnv, TrainConfig, auto_precision


def resolve_device(name: str, env: DistEnv) -> torch.device:
    if name == "auto":
        return torch.device(f"cuda:{env.local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    return torch.device(name)


def start_run(recipe: dict[str, Any]) -> tuple[TrainConfig, DistEnv, torch.device]:
    """What every training recipe starts with: its TrainConfig, the distributed environment and
    the device, with torch seeded from the config."""
    train_config = TrainConfig(**recipe["train"])
    env = DistEnv.from_environment(recipe.get("device", "auto"))
    device = resolve_device(recipe.get("device", "auto"), env)
    torch.manual_seed(train_config.seed)
    return train_config, env, device


def target_dtype(name: str, device: torch.device) -> torch.dtype:
    """A recipe's target_dtype; "auto" is bfloat16 where bf16 runs fast (the trainer's
    `auto_precision`: CUDA, a CPU whose bf16 matmul is fast), else float32 (the same weights, upcast)."""
    if name == "auto":
        return torch.bfloat16 if auto_precision(device) == "bf16" else torch.float32
    return getattr(torch, name)


def load_frozen_target(recipe: dict[str, Any], device: torch.device, target_model=None):
    """The target (recipe["target"] in recipe["target_dtype"], unless given) on the device, frozen."""
    if target_model is None:
        # transformers is imported where a target is loaded (see tools/import_graph.py).
        from transformers import AutoModelForCausalLM

        target_model = AutoModelForCausalLM.from_pretrained(
            recipe["target"], dtype=target_dtype(recipe.get("target_dtype", "bfloat16"), device)
        )
    return target_model.to(device).eval().requires_grad_(False)
