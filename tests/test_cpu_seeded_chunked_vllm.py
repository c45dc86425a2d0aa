"""CPU: a seeded request at T > 0 whose prompt is prefilled in chunks (patch 5 in
vllm_liliprop/vllm/patching.py). Stock vLLM 0.32 crashes the engine here ("CPU Generator does
not use offset"); with the patch the request finishes, and the same seed repeats its sample."""

import pytest

from tests.engine import generate

pytestmark = pytest.mark.vllm


def test_seeded_sampling_with_chunked_prefill_runs_and_repeats(tiny_models):
    prompt = "def f(x):\n    return x\n" * 30  # several chunks of 64 tokens
    flags = {"max_num_batched_tokens": 64, "enable_chunked_prefill": True, "max_num_seqs": 2}
    first, _, _ = generate(tiny_models["target"], prompts=[prompt, prompt], max_tokens=8,
                           temperature=1.0, seeds=[7, 8], extra_flags=flags)
    again, _, _ = generate(tiny_models["target"], prompts=[prompt, prompt], max_tokens=8,
                           temperature=1.0, seeds=[7, 8], extra_flags=flags)
    assert all(len(ids) == 8 for ids in first)
    assert first == again
