"""The plugin in real vLLM engines: loading, exact parity with stock DFlash, control of drafts."""

import json

import pytest

from tests.engine import PROMPTS, generate, run_in_subprocess

pytestmark = pytest.mark.vllm

STOCK_RUN = """
import json, os
from vllm import LLM, SamplingParams
from vllm_liliprop.vllm.metrics import SpecDecodeCounters
from tests.engine import ENGINE_FLAGS, PROMPTS
spec = json.loads(os.environ["SPEC"])
llm = LLM(model=os.environ["TARGET"], speculative_config=spec or None, **ENGINE_FLAGS)
max_tokens = 32 if spec else 40  # plain runs go 8 further for the counter predictions
out = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True), use_tqdm=False)
c = SpecDecodeCounters.read(llm)
drafter = type(llm.llm_engine.model_executor.driver_worker.worker.model_runner.drafter).__name__ if spec else None
print("RESULT=" + json.dumps({"ids": [list(o.outputs[0].token_ids) for o in out],
      "counters": [c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens, list(c.accepted_per_pos)],
      "drafter": drafter}))
"""


def _counters(c):
    return [c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens, list(c.accepted_per_pos)]


@pytest.fixture(scope="module")
def stock(tiny_models):
    """Plain decoding and stock DFlash with the plugin disabled (VLLM_PLUGINS allow-list)."""
    spec = {"method": "dflash", "model": tiny_models["draft"], "num_speculative_tokens": 7}
    env = {"VLLM_PLUGINS": "", "TARGET": tiny_models["target"], "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    with_spec = run_in_subprocess(STOCK_RUN, dict(env, SPEC=json.dumps(spec)))
    plain = run_in_subprocess(STOCK_RUN, dict(env, SPEC="null"))
    return {"dflash": with_spec, "plain": plain}


def test_stock_run_really_is_stock(stock):
    assert stock["dflash"]["drafter"] == "DFlashProposer"
    assert stock["dflash"]["counters"][0] > 0


def test_liliprop_argmax_rule_matches_stock_dflash_exactly(tiny_models, stock):
    ids, counters, drafter = generate(tiny_models["target"], tiny_models["draft"],
                                      options={"rule": "argmax"})
    assert type(drafter).__name__ == "LiliPropProposer"
    assert drafter.draft_rule is not None and drafter.draft_rule.name == "argmax"
    assert ids == stock["dflash"]["ids"]
    assert _counters(counters) == stock["dflash"]["counters"]


def test_plugin_without_options_keeps_stock_drafts(tiny_models, stock):
    ids, counters, drafter = generate(tiny_models["target"], tiny_models["draft"])
    assert type(drafter).__name__ == "LiliPropProposer" and drafter.draft_rule is None
    assert ids == stock["dflash"]["ids"]
    assert _counters(counters) == stock["dflash"]["counters"]


def plain32(stock):
    return [ys[:32] for ys in stock["plain"]["ids"]]


def test_greedy_speculation_equals_plain_decoding(stock):
    assert stock["dflash"]["ids"] == plain32(stock)


def simulate_repeat_anchor(outputs, k, max_tokens=32):
    """Counters predicted for drafting the last verified token k times, from the plain output.

    After prefill the first output token is verified; each step drafts it k times, accepts the
    leading run of equal tokens, and the target adds one bonus token, until max_tokens are out.
    The last step's drafts are verified past max_tokens (the surplus is dropped afterwards), so
    `outputs` must run k tokens longer than max_tokens."""
    drafts = draft_tokens = accepted = 0
    per_pos = [0] * k
    for ys in outputs:
        assert len(ys) >= max_tokens + k
        p = 0
        while p < max_tokens - 1:
            a = 0
            while a < k and ys[p + 1 + a] == ys[p]:
                a += 1
            drafts += 1
            draft_tokens += k
            accepted += a
            for i in range(a):
                per_pos[i] += 1
            p += a + 1
    return [drafts, draft_tokens, accepted, per_pos]


def test_custom_policy_controls_drafts_and_output_stays_exact(tiny_models, stock):
    ids, counters, drafter = generate(tiny_models["target"], tiny_models["draft"],
                                      options={"rule": "tests.policies:repeat_anchor"})
    assert drafter.draft_rule.name == "repeat-anchor"
    assert ids == plain32(stock)
    predicted = simulate_repeat_anchor(stock["plain"]["ids"], 7)
    assert predicted[2] > 0, "fixture output has no repeated tokens; the test would be vacuous"
    assert _counters(counters) == predicted
    assert _counters(counters) != stock["dflash"]["counters"]


@pytest.mark.parametrize("policy", ["tests.policies:exploding", "tests.policies:nan_rows"])
def test_faulty_rule_falls_back_without_changing_output(tiny_models, stock, policy):
    ids, counters, drafter = generate(tiny_models["target"], tiny_models["draft"],
                                      options={"rule": policy})
    assert ids == plain32(stock)
    assert drafter.num_rule_faults > 0
    if policy.endswith("exploding"):  # every row falls back: exactly stock DFlash
        assert _counters(counters) == stock["dflash"]["counters"]


def test_plugin_loads_in_default_multiprocess_mode(tiny_models, stock):
    """Spawned engine-core process: the entry point must patch it too (the rule runs there)."""
    code = """
import json, os
from vllm import LLM, SamplingParams
from vllm_liliprop.vllm.metrics import SpecDecodeCounters
from tests.engine import ENGINE_FLAGS, PROMPTS
llm = LLM(model=os.environ["TARGET"], speculative_config={"method": "dflash",
          "model": os.environ["DRAFT"], "num_speculative_tokens": 7}, **ENGINE_FLAGS)
out = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True), use_tqdm=False)
c = SpecDecodeCounters.read(llm)
print("RESULT=" + json.dumps({"ids": [list(o.outputs[0].token_ids) for o in out],
      "counters": [c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens, list(c.accepted_per_pos)]}))
"""
    env = {"TARGET": tiny_models["target"], "DRAFT": tiny_models["draft"],
           "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
           "VLLM_LILIPROP_OPTIONS": json.dumps({"rule": "tests.policies:repeat_anchor"})}
    result = run_in_subprocess(code, env)
    assert result["ids"] == plain32(stock)
    assert result["counters"] == simulate_repeat_anchor(stock["plain"]["ids"], 7)
