import os

# Engines in tests run in-process (fast start) with a small KV cache, unless a test says otherwise.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """A tiny Qwen3 target with its own BPE tokenizer and a random DFlash draft (block 8)."""
    from vllm_liliprop.fixtures import build_tiny_dflash_draft, build_tiny_target

    root = tmp_path_factory.mktemp("tiny-models")
    target = build_tiny_target(root / "target")
    draft = build_tiny_dflash_draft(root / "dflash", target)
    return {"root": root, "target": str(target), "draft": str(draft)}
