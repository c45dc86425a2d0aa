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
from tests.engine import ENGINE_FLAGS, PROMPTS, find_drafter, liliprop_env

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[1]
DRAFTS = REPO / "testbed/smollm2/round3/drafts"
# Batch 1-2: plain steps; 3-4: two drafts; 5 and up: the maximum, three.
SCHEDULE = [[1, 2, 0], [3, 4, 2], [5, 256, 3]]
LENGTHS = [8, 16, 24, 32, 40]


def generate(target, prompts, speculative_config=None, options=None, details=None):
    """(token ids per prompt, Counter of the k each step was drafted at: each propose() call's,
    and 0 for each plain step the runner handed to keep_plain_step instead). `details` (a dict)
    also receives the spec-decode counters, the drafter's query passes, its context-only steps
    and the handed-over ones."""
    from vllm import LLM, SamplingParams

    from vllm_liliprop.vllm.metrics import SpecDecodeCounters
    from vllm_liliprop.vllm.proposer import LiliPropProposer

    asked: Counter = Counter()
    handed = Counter()
    original, keep = LiliPropProposer.propose, LiliPropProposer.keep_plain_step

    def recording(self, num_speculative_tokens, *args, **kwargs):
        asked[int(num_speculative_tokens)] += 1
        return original(self, num_speculative_tokens, *args, **kwargs)

    def recording_plain(self, *args, **kwargs):
        drafts = keep(self, *args, **kwargs)
        if drafts is not None:  # else vLLM's path follows, through propose()
            asked[0] += 1
            handed["steps"] += 1
        return drafts

    LiliPropProposer.propose, LiliPropProposer.keep_plain_step = recording, recording_plain
    try:
        with liliprop_env(options):
            llm = LLM(model=str(target), speculative_config=speculative_config, **ENGINE_FLAGS)
            drafter = find_drafter(llm) if details is not None else None
            passes = Counter()
            if drafter is not None:
                forward = drafter.model.forward

                def counted(*args, **kwargs):
                    passes["query"] += 1
                    return forward(*args, **kwargs)
                drafter.model.forward = counted
            params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
                      for n in LENGTHS]
            outputs = llm.generate(prompts, params, use_tqdm=False)
            if details is not None:
                details.update(counters=SpecDecodeCounters.from_metrics(llm.get_metrics()),
                               query_passes=passes["query"],
                               context_only=drafter.num_context_only_steps,
                               deferred=drafter._deferred.num_deferred_tokens,
                               dropped=drafter._deferred.num_dropped_tokens,
                               handed=handed["steps"])
            del llm
    finally:
        LiliPropProposer.propose, LiliPropProposer.keep_plain_step = original, keep
    return [list(o.outputs[0].token_ids) for o in outputs], asked


def generate_without(setting: str, *args):
    """generate() with the proposer's class switch `setting` turned off for this one engine."""
    from vllm_liliprop.vllm.proposer import LiliPropProposer

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LiliPropProposer, setting, False)
        return generate(*args)


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


def copying_prompts(target):
    """Five chat prompts whose replies copy a list from the prompt, and their plain outputs."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    items = ["red, green, blue, yellow", "one two three four five six", "alpha beta gamma delta",
             "monday tuesday wednesday thursday", "apple pear plum cherry grape"]
    prompts = [tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Repeat this list ten times, one per line: {x}"}],
        tokenize=False, add_generation_prompt=True) for x in items]
    return prompts, generate(target, prompts)[0]


@pytest.mark.parametrize("options", [{"rule": "argmax"},
                                     {"rule": "argmax", "prompt_lookup": [2, 4]}],
                         ids=["DFlash", "DFlash+lookup"])
def test_steps_without_a_block_write_the_context_without_the_drafters_query_pass(
        smollm2_prompts, options):
    """At k = 0, and where every request drafts its lookup continuation, the proposer only
    keeps the step's context, whose K/V the next drafting pass writes: the drafter's query pass
    runs at the other steps alone, and every later draft is the one vLLM's full pass leads to,
    and the one writing the K/V at once leads to (the shipped drafter reads its context, so the
    acceptance counters would move otherwise)."""
    target, prompts, plain = smollm2_prompts
    if "prompt_lookup" in options:  # replies that copy their prompt, so lookups match
        prompts, plain = copying_prompts(target)
    # Plain steps while the batch is large, then drafts that read the context those steps wrote.
    spec = dict(scheduled("dflash", DRAFTS / "dflash"),
                num_speculative_tokens_per_batch_size=[[1, 2, 3], [3, 256, 0]])
    skipped: dict = {}
    ids, asked = generate(target, prompts, spec, options, skipped)
    assert ids == plain and set(asked) == {0, 3}, asked
    assert skipped["context_only"] >= asked[0] > 0
    assert skipped["query_passes"] + skipped["context_only"] == sum(asked.values())
    if "prompt_lookup" in options:
        assert skipped["context_only"] > asked[0]  # steps drafted by the lookup alone
    # The plain steps' context K/V was written later, at the next drafting pass, and the
    # requests that finished during plain steps dropped theirs (deferred_context.py).
    assert skipped["deferred"] > skipped["dropped"] > 0
    full: dict = {}
    ids_full, asked_full = generate_without("skip_plain_step_queries", target, prompts, spec,
                                            options, full)
    assert ids_full == plain and asked_full == asked
    assert full["context_only"] == 0 and full["query_passes"] == sum(asked.values())
    assert skipped["counters"] == full["counters"], (skipped, full)
    assert full["counters"].num_accepted_tokens > 0
    at_once: dict = {}
    ids_at_once, _ = generate_without("defer_plain_step_context", target, prompts, spec, options,
                                      at_once)
    assert ids_at_once == plain and at_once["deferred"] == 0
    assert at_once["counters"] == skipped["counters"], (at_once, skipped)
    # The runner hands over the k = 0 steps that verify no draft (patching.py, patch 14); the
    # first one after a drafting step would go through propose(). Through vLLM's path at every
    # step, the same tokens are deferred and dropped, and every draft is the same.
    assert 0 < skipped["handed"] <= asked[0], (skipped, asked)
    vllm_path: dict = {}
    ids_vllm_path, asked_vllm_path = generate_without("plain_steps_from_runner", target, prompts,
                                                      spec, options, vllm_path)
    assert ids_vllm_path == plain and asked_vllm_path == asked and vllm_path["handed"] == 0
    assert {key: vllm_path[key] for key in ("counters", "deferred", "dropped", "context_only")} == {
        key: skipped[key] for key in ("counters", "deferred", "dropped", "context_only")}


def test_a_step_without_drafts_samples_as_plain_decoding(tiny_models):
    """A speculative engine whose schedule drafts nothing samples with the plain sampler
    (patching.py, patch 11): seeded at T = 1 its tokens are plain decoding's, token for token,
    and vLLM's rejection sampler never runs."""
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    from tests.engine import generate as run

    seeds = list(range(11, 11 + len(PROMPTS)))
    plain, _, _ = run(tiny_models["target"], temperature=1.0, seeds=seeds)
    calls = Counter()
    forward = RejectionSampler.forward

    def counted(self, *args, **kwargs):
        calls["rejection"] += 1
        return forward(self, *args, **kwargs)

    RejectionSampler.forward = counted
    try:
        ids, counters, _ = run(tiny_models["target"], tiny_models["draft"], num_spec=3, temperature=1.0,
                               seeds=seeds, spec_extra={"num_speculative_tokens_per_batch_size": [[1, 256, 0]]})
    finally:
        RejectionSampler.forward = forward
    assert ids == plain
    assert counters.num_draft_tokens == 0 and calls["rejection"] == 0, (counters, calls)
