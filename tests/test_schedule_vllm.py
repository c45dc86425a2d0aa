"""vLLM 0.32's speculation schedule (`num_speculative_tokens_per_batch_size`, k = 0 allowed) with
this package's proposer on the V1 CPU runner: greedy output equals plain decoding while the
scheduler changes k from step to step, and the steps really ran at k = 0 and at k below the
maximum (the proposer records the k it was asked for).

The requests stop at different lengths, so the batch shrinks 5 -> 1 during a run and every range
of the schedule is visited. The shipped SmolLM2 drafts (real acceptance, every rule) and a tiny
upstream-layout DSpark draft (its anchor layout at k = 0) are checked.
"""

from __future__ import annotations

from collections import Counter
from itertools import islice
from pathlib import Path

import pytest

from tests.builders import build_tiny_dspark
from tests.engine import ENGINE_FLAGS, PROMPTS, liliprop_env

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[1]
DRAFTS = REPO / "testbed/smollm2/round3/drafts"
# Batch 1-2: plain steps; 3-4: two drafts; 5 and up: the maximum, three.
SCHEDULE = [[1, 2, 0], [3, 4, 2], [5, 256, 3]]
LENGTHS = [8, 16, 24, 32, 40]


def generate(target, prompts, speculative_config=None, options=None):
    """(token ids per prompt, Counter of the k each propose() call was asked for)."""
    from vllm import LLM, SamplingParams

    from vllm_liliprop.vllm.proposer import LiliPropProposer

    asked: Counter = Counter()
    original = LiliPropProposer.propose

    def recording(self, num_speculative_tokens, *args, **kwargs):
        asked[int(num_speculative_tokens)] += 1
        return original(self, num_speculative_tokens, *args, **kwargs)

    LiliPropProposer.propose = recording
    try:
        with liliprop_env(options):
            llm = LLM(model=str(target), speculative_config=speculative_config, **ENGINE_FLAGS)
            params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
                      for n in LENGTHS]
            outputs = llm.generate(prompts, params, use_tqdm=False)
            del llm
    finally:
        LiliPropProposer.propose = original
    return [list(o.outputs[0].token_ids) for o in outputs], asked


def scheduled(method, draft):
    return {"method": method, "model": str(draft), "num_speculative_tokens": 3,
            "num_speculative_tokens_per_batch_size": SCHEDULE}


def check(ids, plain, asked):
    assert ids == plain
    assert asked[0] > 0 and asked[2] > 0 and asked[3] > 0, asked
    assert set(asked) <= {0, 2, 3}, asked


@pytest.fixture(scope="module")
def smollm2_prompts():
    from eval.targets import fetch_target
    from training.data import read_jsonl_conversations

    target = fetch_target("smollm2-135m-instruct")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    heldout = read_jsonl_conversations(REPO / "testbed/smollm2/data/heldout_regenerated.jsonl.gz")
    prompts = [tokenizer.apply_chat_template(conv["messages"][:1], tokenize=False,
                                             add_generation_prompt=True)
               for conv in islice(heldout, len(LENGTHS))]
    plain, _ = generate(target, prompts)
    return target, prompts, plain


@pytest.mark.parametrize("system", [("dflash", "dflash", None),
                                    ("dflash", "lilicorr", None),
                                    ("dflash", "dflash", {"rule": "dels", "dels_path": "dels"}),
                                    ("dspark", "dspark", None),
                                    ("dflash", "dflash", {"rule": "argmax", "prompt_lookup": [2, 4]})],
                         ids=["DFlash", "LiLiCorr", "DeLS-GRU", "DSpark-fill-in", "DFlash+lookup"])
def test_shipped_drafts_under_a_schedule_with_plain_steps(smollm2_prompts, system):
    target, prompts, plain = smollm2_prompts
    method, draft, options = system
    ids, asked = generate(target, prompts, scheduled(method, DRAFTS / draft), options)
    check(ids, plain, asked)


def test_dspark_anchor_layout_under_a_schedule_with_plain_steps(tiny_models):
    draft = build_tiny_dspark(tiny_models["root"] / "dspark-anchor-schedule",
                              tiny_models["target"], sample_from_anchor=True)
    plain, _ = generate(tiny_models["target"], PROMPTS)
    ids, asked = generate(tiny_models["target"], PROMPTS, scheduled("dspark", draft))
    check(ids, plain, asked)
