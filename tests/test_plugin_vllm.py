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


def simulate_repeat_anchor(outputs, k):
    return predict_counters(outputs, lambda ys, p: [ys[p]] * k, k)


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


def test_version_check_names_the_supported_version():
    from vllm_liliprop.vllm.plugin import UnsupportedVllmVersion, check_vllm_version

    check_vllm_version("0.32.0")
    check_vllm_version("0.32.3+cpu")
    with pytest.raises(UnsupportedVllmVersion, match="supports vLLM 0.32.x, found 0.33.1"):
        check_vllm_version("0.33.1")


def test_register_is_idempotent_and_patches_once():
    from vllm.config import VllmConfig
    from vllm.v1.worker import gpu_model_runner

    from vllm_liliprop.vllm import patching, plugin
    from vllm_liliprop.vllm.proposer import LiliPropProposer

    plugin.register()
    wrapped = VllmConfig._get_v2_model_runner_unsupported_features
    bookkeeping = gpu_model_runner.GPUModelRunner._bookkeeping_sync
    patching.apply_patches()
    plugin.register()
    assert gpu_model_runner.DFlashProposer is LiliPropProposer
    assert VllmConfig._get_v2_model_runner_unsupported_features is wrapped
    assert gpu_model_runner.GPUModelRunner._bookkeeping_sync is bookkeeping
    for patched in (wrapped, bookkeeping):
        original = getattr(patched, "__liliprop_original__")
        assert getattr(original, "__liliprop_original__", None) is None


def _broken_draft(tiny_models, name, edit):
    import shutil
    from pathlib import Path

    draft = Path(tiny_models["root"]) / name
    if not draft.exists():
        shutil.copytree(tiny_models["draft"], draft)
    config = json.loads((draft / "config.json").read_text())
    edit(config)
    (draft / "config.json").write_text(json.dumps(config))
    return draft


@pytest.mark.parametrize(
    "name, edit, message",
    [
        ("bad-walk", lambda c: c["dflash_config"].update(liliprop={"walk": "zigzag"}),
         "dflash_config.liliprop.walk = 'zigzag' is not valid"),
        ("bad-rule", lambda c: c["dflash_config"].update(liliprop={"rule": "bogus"}),
         "dflash_config.liliprop.rule = 'bogus'"),
        ("lilicorr-missing-fields", lambda c: c.update(architectures=["LiLiCorrDraftModel"]),
         "dflash_config.lilicorr_logit_scale missing"),  # ours, before vLLM's KeyError
    ],
)
def test_broken_draft_config_fails_at_load_naming_the_field(tiny_models, name, edit, message):
    draft = _broken_draft(tiny_models, name, edit)
    with pytest.raises(Exception) as error:
        generate(tiny_models["target"], draft)
    chain, exc = [], error.value
    while exc is not None:
        chain.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    assert any(message in text for text in chain), chain


def test_cpu_expand_kernel_replacement_keeps_dtype_and_values():
    import torch

    from vllm_liliprop.vllm.patching import expand_kernel_cpu

    temps = torch.tensor([0.7, -1.0, 1.3])
    out = torch.full((6,), float("nan"))
    expand_kernel_cpu(out, temps, torch.tensor([2, 5, 6], dtype=torch.int32), -1.0, 1)
    assert out.tolist() == pytest.approx([0.7, 0.7, 1.0, 1.0, 1.0, 1.3])
    ints = torch.zeros(3, dtype=torch.int64)
    expand_kernel_cpu(ints, torch.tensor([4, 0]), torch.tensor([1, 3]), 0, 9)
    assert ints.tolist() == [4, 9, 9]


def test_cpu_expand_kernel_patch_is_registered():
    from vllm.triton_utils.dispatcher import _registry
    from vllm.utils import cpu_triton_utils

    from vllm_liliprop.vllm import plugin
    from vllm_liliprop.vllm.patching import expand_kernel_cpu

    plugin.register()
    assert cpu_triton_utils._expand_kernel_impl is expand_kernel_cpu
    name = "vllm.v1.sample.rejection_sampler.expand_kernel"
    assert name not in _registry or _registry[name][1] is expand_kernel_cpu
