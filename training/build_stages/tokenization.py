"""Stage "tokenize": conversations -> ids + assistant loss mask (training.data), one file per part."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from training.data import TokenizedDataset

__all__ = ["tokenize_stage"]


def tokenize_stage(tokenizer, parts: dict[str, tuple[Iterable[dict], Path]], max_length: int, *,
                   min_supervised: dict[str, int] | None = None, progress: bool = False) -> dict[str, Any]:
    """For every part name -> (conversations, output .jsonl): tokenize with the chat template,
    cut to `max_length`, drop examples with fewer than min_supervised[part] (default 2)
    loss-masked tokens (0 keeps one example per conversation, in order), save a TokenizedDataset.

    Returns {part: {"examples", "tokens", "supervised_tokens"}}.
    """
    counts = {}
    for part, (conversations, output) in parts.items():
        dataset = TokenizedDataset.from_conversations(tokenizer, conversations, max_length,
                                                      min_supervised=(min_supervised or {}).get(part, 2),
                                                      progress=progress)
        dataset.save(output)
        counts[part] = {"examples": len(dataset), "tokens": sum(map(len, dataset.input_ids)),
                        "supervised_tokens": int(sum(sum(m) for m in dataset.loss_masks))}
    return counts
