"""Stage "dflash" / "lilicorr": a drafter (or drafter + LiLiCorr head) trained by training.pipeline,
exported into its serving folder with the target's tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from training.pipeline import run_draft_training

__all__ = ["tail_means", "run_tail", "draft_stage"]

DRAFT_TAIL_KEYS = ("loss", "accept_argmax", "slot_accuracy")


def tail_means(history: list[dict], keys: tuple[str, ...], steps: int) -> dict[str, float]:
    """Mean of every key over the last `steps` training steps (one step alone is noisy); keys a
    run did not log (or a run that trained no step now, being finished already) are left out."""
    tail = history[-steps:]
    out = {}
    for key in keys:
        values = [float(h[key]) for h in tail if key in h]
        if values:
            out[key] = round(sum(values) / len(values), 4)
    return out


def run_tail(result: dict[str, Any], keys: tuple[str, ...], steps: int) -> dict[str, float]:
    """tail_means over the last `steps` steps of a Trainer run. A resumed run's history starts at
    its checkpoint, so the steps before it come from the run's metrics.jsonl (every step when
    log_every is 1, else the logged ones)."""
    history, trainer = result["history"], result["trainer"]
    if len(history) < min(steps, trainer.step):
        by_step = {}
        path = Path(trainer.output_dir) / "metrics.jsonl"
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    entry = json.loads(line)
                    by_step[entry["step"]] = entry
        by_step.update({h["step"]: h for h in history})
        history = [by_step[s] for s in sorted(by_step) if s > trainer.step - steps]
    return tail_means(history, keys, steps)


def draft_stage(recipe: dict[str, Any], destination: str | Path, tokenizer_dir: str | Path, *,
                target_model=None, dataset=None, resume: bool = True, progress: bool = True,
                tail_steps: int = 20) -> dict[str, Any]:
    """Train per a training.pipeline recipe (method "dflash" or "lilicorr"; target_model /
    dataset may be passed instead of the recipe's target / data), resuming from the latest
    checkpoint in train.output_dir; copy the export to `destination` with the tokenizer of
    `tokenizer_dir`.

    Returns {"recipe", "steps", "path", "train_tail": {loss, accept_argmax, slot_accuracy means
    over the last `tail_steps` steps}}.
    """
    from transformers import AutoTokenizer

    result = run_draft_training(recipe, resume=resume, target_model=target_model, dataset=dataset,
                                progress=progress)
    destination = Path(destination)
    shutil.copytree(result["export_dir"], destination, dirs_exist_ok=True)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(destination)
    return {"recipe": recipe, "steps": result["trainer"].step, "path": str(destination),
            "train_tail": run_tail(result, DRAFT_TAIL_KEYS, tail_steps)}
