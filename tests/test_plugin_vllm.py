"""The plugin in real vLLM engines: loading, exact parity with stock DFlash, control of drafts."""

import json

import pytest

from tests.engine import counters_list, generate, plain32, predict_counters, run_in_subprocess

pytestmark = pytest.mark.vllm

def test_stock_run_really_is_stock(stock):
    assert stock["dflash"]["drafter"] == "DFlashProposer"
    assert stock["dflash"]["counters"][0] > 0


def test_liliprop_argmax_rule_matches_stock_dflash_exactly(tiny_models, stock):
    ids, counters, drafter = generate(tiny_models["target"], tiny_models["draft"],
                                      options={"rule": "argmax"})
    assert type(drafter).__name__ == "LiliPropProposer"
    assert drafter.draft_rule is not None and drafter.draft_rule.name == "argmax"
    assert ids == stock["dflash"]["ids"]
    assert counters_list(counters) == stock["dflash"]["counters"]


def test_plugin_without_options_keeps_stock_drafts(tiny_models, stock):
    ids, counters, drafter = generate(tiny_models["target"], tiny_models["draft"])
    assert type(drafter).__name__ == "LiliPropProposer" and drafter.draft_rule is None
    assert ids == stock["dflash"]["ids"]
    assert counters_list(counters) == stock["dflash"]["counters"]


def test_greedy_speculation_equals_plain_decoding(stock):
    assert stock["dflash"]["ids"] == plain32(stock)


def simulate_repeat_anchor(outputs, k):
    return predictcounters_list(outputs, lambda ys, p: [ys[p]] * k, k)


def test_custom_policy_controls_drafts_and_output_stays_exact(tiny_models, stock):
    ids, counters, drafter = generate(tiny_models["target"], tiny_models["draft"],
                                      options={"rule": "tests.policies:repeat_anchor"})
    assert drafter.draft_rule.name == "repeat-anchor"
    assert ids == plain32(stock)
    predicted = simulate_repeat_anchor(stock["plain"]["ids"], 7)
    assert predicted[2] > 0, "fixture output has no repeated tokens; the test would be vacuous"
    assert counters_list(counters) == predicted
    assert counters_list(counters) != stock["dflash"]["counters"]


@pytest.mark.parametrize("policy", ["tests.policies:exploding", "tests.policies:nan_rows"])
def test_faulty_rule_falls_back_without_changing_output(tiny_models, stock, policy):
    ids, counters, drafter = generate(tiny_models["target"], tiny_models["draft"],
                                      options={"rule": policy})
    assert ids == plain32(stock)
    assert drafter.num_rule_faults > 0
    if policy.endswith("exploding"):  # every row falls back: exactly stock DFlash
        assert counters_list(counters) == stock["dflash"]["counters"]


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
