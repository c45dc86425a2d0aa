"""Stage "dels_gru" / "dels_markov": a DeLS short head with its unigram prior (training.train_dels),
re-saved into its serving folder in the shipped dtype."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from training.build_stages.drafts import run_tail
from training.export import resave_dels
from training.train_dels import load_target_embedding, run_dels_training

__all__ = ["dels_stage"]


def dels_stage(recipe: dict[str, Any], destination: str | Path, dtype: torch.dtype, *,
               embed_weight: torch.Tensor | None = None, dataset=None, tokenizer=None, resume: bool = True,
               progress: bool = True, tail_steps: int = 20) -> dict[str, Any]:
    """Train per a training.train_dels recipe (method "dels"; embed_weight / dataset / tokenizer
    may be passed instead of the recipe's target / data), resuming from the latest checkpoint in
    train.output_dir; write the DeLS folder to `destination` with head weights in `dtype` (the
    prior stays fp32).

    Returns {"recipe", "steps", "path", "train_tail": {"ce": mean over the last `tail_steps`}}.
    """
    result = run_dels_training(recipe, resume=resume, embed_weight=embed_weight, dataset=dataset,
                               tokenizer=tokenizer, progress=progress)
    if embed_weight is None:  # the folder is loaded (and re-saved) against the target's table
        embed_weight = load_target_embedding(str(recipe["target"]))
    resave_dels(result["export_dir"], destination, embed_weight, dtype)
    return {"recipe": recipe, "steps": result["trainer"].step, "path": str(destination),
            "train_tail": run_tail(result, ("ce",), tail_steps)}
