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


STOCK_RUN = """
import json, os
from vllm import LLM, SamplingParams
from vllm_liliprop.vllm.metrics import SpecDecodeCounters
from tests.engine import ENGINE_FLAGS, PROMPTS
spec = json.loads(os.environ["SPEC"])
llm = LLM(model=os.environ["TARGET"], speculative_config=spec or None, **ENGINE_FLAGS)
max_tokens = 32 if spec else 40  # plain runs go 8 further for the counter predictions
params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
out = llm.generate(PROMPTS, params, use_tqdm=False)
c = SpecDecodeCounters.read(llm)
runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
drafter = type(runner.drafter).__name__ if spec else None
print("RESULT=" + json.dumps({"ids": [list(o.outputs[0].token_ids) for o in out],
      "counters": [c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens,
                   list(c.accepted_per_pos)], "drafter": drafter}))
"""


@pytest.fixture(scope="session")
def stock(tiny_models):
    """Plain greedy decoding (40 tokens) and stock DFlash (32 tokens) with this plugin disabled
    through vLLM's VLLM_PLUGINS allow-list, each in a fresh process."""
    import json

    from tests.engine import run_in_subprocess

    spec = {"method": "dflash", "model": tiny_models["draft"], "num_speculative_tokens": 7}
    env = {"VLLM_PLUGINS": "", "TARGET": tiny_models["target"],
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    with_spec = run_in_subprocess(STOCK_RUN, dict(env, SPEC=json.dumps(spec)))
    plain = run_in_subprocess(STOCK_RUN, dict(env, SPEC="null"))
    return {"dflash": with_spec, "plain": plain}


@pytest.fixture(scope="session")
def ranked(stock):
    """Candidates of the constant drafters: a token never in the plain outputs first, the most
    common output token second, two more unseen tokens after."""
    from tests.engine import most_common_token, unused_tokens

    plain = stock["plain"]["ids"]
    z0, z1, z2 = unused_tokens(plain, 1024, 3)
    return [z0, most_common_token(plain), z1, z2]
