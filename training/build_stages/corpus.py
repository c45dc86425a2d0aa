"""The offline testbed's text (Python standard-library sources) and its prompts.

Stage "corpus": train / held-out files split by a hash of the file name (OUT/data/split.json).
Stage "prompts": code-completion prompts (a few lines of a file) and chat prompts ("write the
function `f(x)`: <first docstring line>"), drawn seeded from each side of the split.
"""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from training.build_stages.jsonl import write_jsonl
from vllm_liliprop.fixtures import local_corpus_files

__all__ = ["split_corpus", "read_source", "code_windows", "function_requests", "conversation",
           "sample_prompts", "corpus_stage", "prompts_stage"]


def _name_bucket(path: Path) -> int:
    """0..99 from sha256 of the file name: the content changes between Python releases, the
    name does not, so every machine puts a file on the same side."""
    return int.from_bytes(hashlib.sha256(path.name.encode()).digest()[:8], "big") % 100


def split_corpus(heldout_percent: int, max_train_files: int, max_heldout_files: int) -> dict[str, list[Path]]:
    """{"train": [...], "heldout": [...]}: standard-library .py files, sorted, split by name hash."""
    if not 0 < heldout_percent < 100:
        raise ValueError(f"corpus.heldout_percent must be in (0, 100), got {heldout_percent}")
    files = local_corpus_files()
    heldout = [p for p in files if _name_bucket(p) < heldout_percent]
    train = [p for p in files if _name_bucket(p) >= heldout_percent]
    if not heldout or not train:
        raise ValueError("the standard library gave an empty split; raise or lower corpus.heldout_percent")
    return {"train": train[:max_train_files], "heldout": heldout[:max_heldout_files]}


def read_source(path: Path, max_chars: int) -> str:
    return path.read_text(encoding="utf-8", errors="replace")[:max_chars]


def code_windows(text: str, prefix_lines: int, continuation_lines: int, stride: int) -> list[tuple[str, str]]:
    """(prefix, continuation) pairs of whole lines; windows whose prefix is blank are skipped."""
    lines = text.splitlines(keepends=True)
    out = []
    for start in range(0, max(0, len(lines) - prefix_lines - continuation_lines) + 1, stride):
        prefix = "".join(lines[start:start + prefix_lines])
        continuation = "".join(lines[start + prefix_lines:start + prefix_lines + continuation_lines])
        if prefix.strip() and continuation.strip():
            out.append((prefix, continuation))
    return out


def function_requests(text: str, max_chars: int = 1500) -> list[tuple[str, str]]:
    """(request, source) for every documented function: a chat-style prompt from the signature
    and the first docstring line; the function's own source is the reference answer."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []  # a file cut by max_chars_per_file may end mid-statement
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            source = ast.get_source_segment(text, node)
            if not doc or not source or not doc.strip():
                continue
            summary = doc.strip().splitlines()[0]
            request = f"Write the Python function `{node.name}({ast.unparse(node.args)})`: {summary}"
            out.append((request, source[:max_chars]))
    return out


def conversation(user: str, assistant: str | None = None) -> list[dict[str, str]]:
    messages = [{"role": "user", "content": user}]
    if assistant is not None:
        messages.append({"role": "assistant", "content": assistant})
    return messages


def sample_prompts(files: list[Path], corpus: dict, num_code: int, num_chat: int, rng: torch.Generator,
                   tag: str) -> list[dict]:
    """num_code completion prompts and num_chat chat prompts drawn (seeded) from `files`:
    [{"id", "kind", "file", "messages" (user only), "reference"}]."""
    code, chat = [], []
    for path in files:
        text = read_source(path, corpus["max_chars_per_file"])
        code += [(path.name, p, c) for p, c in code_windows(
            text, corpus["prefix_lines"], corpus["continuation_lines"], corpus["window_stride_lines"])]
        chat += [(path.name, q, a) for q, a in function_requests(text)]
    picked = []
    for kind, pool, count in (("code", code, num_code), ("chat", chat, num_chat)):
        order = torch.randperm(len(pool), generator=rng).tolist()[:count]
        for n, i in enumerate(sorted(order)):
            name, user, reference = pool[i]
            picked.append({"id": f"{tag}-{kind}-{n}", "kind": kind, "file": name,
                           "messages": conversation(user), "reference": reference})
    return picked


def corpus_stage(split: dict[str, list[Path]], split_file: Path) -> dict[str, Any]:
    """Write the split's file names to `split_file`; returns {"train_files", "heldout_files"}."""
    split_file.parent.mkdir(parents=True, exist_ok=True)
    split_file.write_text(json.dumps({k: [p.name for p in v] for k, v in split.items()}, indent=1))
    return {"train_files": len(split["train"]), "heldout_files": len(split["heldout"])}


def prompts_stage(split: dict[str, list[Path]], corpus: dict, regenerate: dict, suites: dict, seed: int,
                  data_dir: Path) -> dict[str, Any]:
    """data_dir/train_prompts.jsonl (regenerate.code_prompts + chat_prompts, the drafts' training
    data once the target answers them) and data_dir/heldout_prompts.jsonl (the suites' sizes
    plus three entropy tiers' worth of each kind to choose the tiers from), one seeded draw.

    Returns {"train": {kind: count}, "heldout": {kind: count}}.
    """
    rng = torch.Generator().manual_seed(seed)
    tier_pool = 3 * suites["entropy_per_tier"]
    prompts = {
        "train": sample_prompts(split["train"], corpus, regenerate["code_prompts"], regenerate["chat_prompts"],
                                rng, "train"),
        "heldout": sample_prompts(split["heldout"], corpus, suites["code"] + tier_pool, suites["chat"] + tier_pool,
                                  rng, "heldout"),
    }
    for part, rows in prompts.items():
        write_jsonl(data_dir / f"{part}_prompts.jsonl", rows)
    return {part: {kind: sum(r["kind"] == kind for r in rows) for kind in ("code", "chat")}
            for part, rows in prompts.items()}
