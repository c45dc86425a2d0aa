"""Next-token language modelling through the shared Trainer (the testbed's target from scratch).

The objective plugs into training.trainer.Trainer as the drafter objectives do (training.objective,
training.train_dels): `NextTokenObjective(model)(input_ids, labels)` returns {"loss": mean
next-token CE over the batch's predicted tokens, "tokens": their number}, and `loss_for_ranks`
rescales it so that DDP averages to the global token mean. Sequences are padded on the right;
padding carries label -100 and is masked out of attention and loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from training.trainer import DistEnv, Trainer, TrainConfig

__all__ = ["pad_sequences", "next_token_loss", "NextTokenObjective", "run_lm_training"]


def pad_sequences(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, T] int64 and labels [B, T] (the ids, -100 on padding)."""
    length = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.int64)
    labels = torch.full((len(sequences), length), -100, dtype=torch.int64)
    for row, seq in enumerate(sequences):
        ids[row, :len(seq)] = torch.tensor(seq)
        labels[row, :len(seq)] = torch.tensor(seq)
    return ids, labels


def next_token_loss(model, ids: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of next-token CE in fp32, number of predicted tokens) of a causal LM."""
    logits = model(input_ids=ids, attention_mask=(labels != -100).long()).logits[:, :-1].float()
    targets = labels[:, 1:]
    ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum")
    return ce, (targets != -100).sum()


class NextTokenObjective(nn.Module):
    """A causal LM (e.g. Qwen3ForCausalLM) trained on its own next-token CE."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        total, count = next_token_loss(self.model, input_ids, labels)
        loss = total / count.clamp(min=1)
        return {"loss": loss, "tokens": count.float()}

    def loss_for_ranks(self, terms: dict[str, torch.Tensor], mean_over_ranks) -> torch.Tensor:
        return terms["loss"] * terms["tokens"] / mean_over_ranks(terms["tokens"]).clamp(min=1)


def run_lm_training(model: nn.Module, sequences: Sequence[Sequence[int]], pad_id: int, config: TrainConfig, *,
                    device: str = "cpu", resume: bool | str | None = True, progress: bool = False) -> dict[str, Any]:
    """Train `model` (all its parameters, optimizer group "model") on `sequences` per `config`;
    the Trainer's epoch permutation orders them and `config.batch_size` are one step. With
    resume=True an interrupted run continues from its latest checkpoint in config.output_dir.
    Returns {"history", "trainer"}; the model is left in eval mode."""
    env = DistEnv.from_environment(device)
    objective = NextTokenObjective(model.to(device))

    def make_inputs(indices: list[int], epoch: int) -> dict[str, Any]:
        ids, labels = pad_sequences([sequences[i] for i in indices], pad_id)
        return {"input_ids": ids.to(device), "labels": labels.to(device)}

    trainer = Trainer(objective, {"model": model}, make_inputs, len(sequences), config, device=device,
                      dist_env=env, checkpoint_extras={"kind": "lm"}, progress=progress)
    history = trainer.fit(resume=resume)
    model.eval()
    return {"history": history, "trainer": trainer}
