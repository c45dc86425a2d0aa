"""The library versions a build ran with (every builder's manifest records them)."""

from __future__ import annotations

import platform

import tokenizers
import torch

from vllm_liliprop.versions import installed_vllm

__all__ = ["versions"]


def versions() -> dict[str, str | None]:
    import transformers

    vllm = installed_vllm()
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__, "vllm": vllm and vllm[1]}
