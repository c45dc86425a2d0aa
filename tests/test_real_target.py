"""The real target (SmolLM2-135M-Instruct from its pinned PyPI wheel) in real vLLM engines.

Setup fetches and converts the target (eval/targets.py); these tests use that cached folder.
Random drafts for it come from this project's own training code (a Llama target, 30 layers):
greedy output of DFlash and of the lattice rule must equal plain decoding on benchmark prompts.
Engines run in fp32: in bf16, vLLM 0.32's CPU kernels give a multi-token verification pass
logits that differ in the last bits from a one-token decode step, so near-ties can flip with
any drafter, stock DFlash included (measured: 5 of 9 prompts identical in bf16, 9 of 9 in fp32).
"""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TARGET = "smollm2-135m-instruct"
LAYER_TAPS = [1, 7, 14, 21, 28]
FLAGS = {"dtype": "float32", "max_model_len": 2048}


@pytest.fixture(scope="module")
def smollm2():
    from eval.targets import fetch_target

    return fetch_target(TARGET)


@pytest.fixture(scope="module")
def random_drafts(smollm2, tmp_path_factory):
    """A random 1-layer DFlash draft and a random LiLiCorr draft (K 4, 1-layer head), block 8."""
    import torch
    from transformers import AutoConfig, AutoTokenizer

    from training.drafter import DFlashDrafter, DrafterConfig
    from training.export import export_dflash, export_lilicorr
    from training.pipeline import build_lattice

    root = tmp_path_factory.mktemp("smollm2-drafts")
    config = DrafterConfig.from_target(AutoConfig.from_pretrained(smollm2), num_hidden_layers=1,
                                       block_size=8, mask_token_id=16, target_layer_ids=LAYER_TAPS)
    torch.manual_seed(0)
    drafter = DFlashDrafter(config)
    lattice = build_lattice({"candidate_topk": 4, "hidden_size": 0, "num_layers": 1, "num_heads": 4,
                             "factor_dim": 64}, config)
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    out = {"dflash": export_dflash(root / "dflash", drafter),
           "lilicorr": export_lilicorr(root / "lilicorr", drafter, lattice)}
    for folder in out.values():
        tokenizer.save_pretrained(folder)
    return out


@pytest.fixture(scope="module")
def prompts(smollm2):
    """Two prompts of each of three fetched benchmarks, through the target's chat template."""
    from transformers import AutoTokenizer

    from eval.benchmarks import load_benchmark
    from eval.pypi import cache_root

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    turns = [e.turns[0] for name in ("humaneval", "gsm8k", "mtbench")
             for e in load_benchmark(name, data_dir=cache_root() / "benchmarks", limit=2)]
    return [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                          add_generation_prompt=True) for t in turns]


def test_converted_target_is_the_pinned_one(smollm2):
    from eval.pypi import file_sha256
    from eval.targets import WEIGHTS_FILE, target_source

    config = json.loads((smollm2 / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    assert file_sha256(smollm2 / WEIGHTS_FILE) == target_source(TARGET).weights_sha256


def test_greedy_drafts_reproduce_plain_decoding(smollm2, random_drafts, prompts):
    from tests.engine import generate

    plain, _, _ = generate(smollm2, prompts=prompts, max_tokens=32, extra_flags=FLAGS)
    dflash, counters, drafter = generate(smollm2, random_drafts["dflash"], prompts=prompts,
                                         max_tokens=32, extra_flags=FLAGS)
    assert counters.num_drafts > 0 and type(drafter).__name__ == "LiliPropProposer"
    assert dflash == plain
    lattice, counters, _ = generate(smollm2, random_drafts["lilicorr"], prompts=prompts,
                                    max_tokens=32, extra_flags=FLAGS, options={"rule": "lattice"})
    assert counters.num_drafts > 0
    assert lattice == plain
