"""Stage "regenerate": the target's greedy replies to prompt files, through one vLLM engine."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

from training.build_stages.jsonl import read_jsonl
from training.data import read_jsonl_conversations
from training.regenerate import regenerate_conversations, vllm_chat_generator

__all__ = ["regenerate_stage"]


def regenerate_stage(target_dir: str | Path, parts: dict[str, tuple[Path, Path]], *, max_tokens: int,
                     max_model_len: int, seed: int, chunk_size: int = 256, progress: bool = True,
                     **engine: Any) -> dict[str, Any]:
    """For every part name -> (prompts .jsonl, output .jsonl), in order: append the target's greedy
    reply to every prompt not yet in the output (training.regenerate resumes a partial file).
    `engine`: further vllm.LLM arguments (dtype, enforce_eager, ...). vLLM is imported here only.

    Returns {"conversations": {part: rows in its output}, "max_tokens", "decoding": "greedy"}.
    """
    generate = vllm_chat_generator(str(target_dir), max_tokens=max_tokens, max_model_len=max_model_len,
                                   seed=seed, **engine)
    counts = {}
    for part, (prompts, output) in parts.items():
        regenerate_conversations(read_jsonl_conversations(prompts), generate, output, chunk_size=chunk_size,
                                 progress=progress)
        counts[part] = len(read_jsonl(output))
    # An in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0) frees its memory and cores here.
    del generate
    gc.collect()
    return {"conversations": counts, "max_tokens": max_tokens, "decoding": "greedy"}
