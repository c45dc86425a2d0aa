"""Greedy verification's CPU path (vllm/greedy_verify.py, patch 12): the same output as vLLM's
rejection sampler on the batches it takes, taken by every plain greedy batch of a real engine,
and left to vLLM wherever a request's settings can move an argmax."""

from __future__ import annotations

import json
from collections import Counter
from itertools import islice
from pathlib import Path

import pytest
import torch

from tests.engine import ENGINE_FLAGS

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[1]
VOCAB = 300


def _metadata(processors=()):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    empty = torch.empty(0)
    return SamplingMetadata(
        temperature=None, all_greedy=True, all_random=False, top_p=None, top_k=None, generators={},
        max_num_logprobs=None, no_penalties=True, prompt_token_ids=None, frequency_penalties=empty,
        presence_penalties=empty, repetition_penalties=empty, output_token_ids=[],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors(processors))


def _case(generator: torch.Generator, batch: int):
    """(drafts per request, bf16 logits [tokens + batch, VOCAB]): drafts of 0-4 tokens that follow
    the target's argmax for a random prefix, in logits with many exact ties."""
    lengths = torch.randint(0, 5, (batch,), generator=generator).tolist()
    logits = (torch.randint(0, 6, (sum(lengths) + batch, VOCAB), generator=generator) / 2).to(torch.bfloat16)
    drafts, row = [], 0
    for length in lengths:
        agree = torch.randint(0, length + 1, (1,), generator=generator).item()
        ids = [int(logits[row + i].float().argmax()) if i < agree
               else int(torch.randint(0, VOCAB, (1,), generator=generator)) for i in range(length)]
        drafts.append(ids)
        row += length + 1
    return drafts, logits


def test_the_cpu_path_answers_as_vllms_rejection_sampler():
    from vllm.platforms import current_platform
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    from vllm_liliprop.vllm import greedy_verify, patching

    patching.apply_patches()
    current_platform.register_triton_kernel_overrides()  # what an engine's start does on CPU
    vllms = getattr(RejectionSampler.forward, "__liliprop_original__")
    sampler = RejectionSampler(Sampler())
    generator = torch.Generator().manual_seed(0)
    accepted = 0
    for _ in range(40):
        drafts, logits = _case(generator, int(torch.randint(1, 9, (1,), generator=generator)))
        metadata = SpecDecodeMetadata.make_dummy(drafts, torch.device("cpu"))
        want = vllms(sampler, metadata, None, logits.clone(), _metadata()).sampled_token_ids
        assert greedy_verify.applies(_metadata(), sampler.synthetic_mode)
        got = greedy_verify.greedy_verify(metadata, logits).sampled_token_ids
        assert torch.equal(got, want), (drafts, got, want)
        accepted += int((want >= 0).sum()) - len(drafts)
    assert accepted > 20  # the drafts were accepted, not only rejected at once


def test_batches_whose_argmax_a_setting_can_move_go_to_vllm():
    from dataclasses import replace

    from vllm.v1.sample.logits_processor.builtin import LogitBiasLogitsProcessor, MinTokensLogitsProcessor

    from vllm_liliprop.vllm.greedy_verify import applies

    bias = LogitBiasLogitsProcessor(None, torch.device("cpu"), False)
    minimum = MinTokensLogitsProcessor(None, torch.device("cpu"), False)
    assert applies(_metadata([bias, minimum]), False)  # built for every engine, idle
    bias.biases[0] = {5: 10.0}
    assert not applies(_metadata([bias, minimum]), False)

    class Custom:
        def is_argmax_invariant(self):
            return False

    base = _metadata()
    for changed in (replace(base, all_greedy=False), replace(base, max_num_logprobs=0),
                    replace(base, no_penalties=False), replace(base, bad_words_token_ids={0: [[3]]}),
                    replace(base, allowed_token_ids_mask=torch.ones(1, VOCAB, dtype=torch.bool)),
                    _metadata([Custom()])):
        assert not applies(changed, False), changed
    assert not applies(base, True)  # vLLM's synthetic acceptance mode


def _generate(target, prompts, speculative_config=None, **settings):
    from vllm import LLM, SamplingParams

    from vllm_liliprop.vllm.metrics import SpecDecodeCounters

    llm = LLM(model=str(target), speculative_config=speculative_config, **ENGINE_FLAGS)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, **settings)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    counters = SpecDecodeCounters.from_metrics(llm.get_metrics())
    del llm
    return [list(o.outputs[0].token_ids) for o in outputs], counters


def test_a_served_draft_verifies_by_the_cpu_path_and_a_min_tokens_request_by_vllms(monkeypatch):
    from eval.targets import fetch_target
    from training.data import read_jsonl_conversations
    from transformers import AutoTokenizer
    from vllm_liliprop.vllm import greedy_verify

    target = fetch_target("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(target)
    heldout = read_jsonl_conversations(REPO / "testbed/smollm2/data/heldout_regenerated.jsonl.gz")
    prompts = [tokenizer.apply_chat_template(c["messages"][:1], tokenize=False, add_generation_prompt=True)
               for c in islice(heldout, 4)]
    spec = {"method": "dflash", "model": str(REPO / "testbed/smollm2/round3/drafts/dflash"),
            "num_speculative_tokens": 3}
    calls = Counter()
    original = greedy_verify.greedy_verify

    def counted(*args):
        calls["cpu path"] += 1
        return original(*args)

    monkeypatch.setattr(greedy_verify, "greedy_verify", counted)
    plain, _ = _generate(target, prompts)
    ids, counters = _generate(target, prompts, spec)
    assert ids == plain and calls["cpu path"] > 0 and counters.num_accepted_tokens > 0
    # A stop token held back for min_tokens moves the argmax (vLLM refuses logit_bias with drafts).
    held_back = dict(min_tokens=24, stop_token_ids=[plain[0][3]])
    calls.clear()
    plain_held, _ = _generate(target, prompts, **held_back)
    ids, _ = _generate(target, prompts, spec, **held_back)
    assert plain_held != plain and ids == plain_held and calls["cpu path"] == 0


_ONE_KERNEL_LIBRARY = """
import json, re, torch
from vllm.platforms import current_platform
current_platform.import_kernels()  # what an engine's start loads: this host's ISA build
from vllm_liliprop.vllm.cpu_argmax import row_argmax
logits = torch.randn(3, 1000)
assert row_argmax(logits).tolist() == logits.argmax(dim=-1).tolist()
maps = open("/proc/self/maps").read()
print(json.dumps(sorted(set(re.findall(r"vllm/(_C(?:_AVX2|_AVX512)?)\\.abi3\\.so", maps)))))
"""


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps (Linux)")
def test_the_cpu_argmax_loads_no_second_kernel_library():
    """vLLM's CPU wheel ships one kernel library per ISA, each registering torch.ops._C; a
    second one loaded aborts the process (torch: "Only a single TORCH_LIBRARY"). The argmax
    op must come from the build the platform loaded: importing `vllm._C` by name crashed every
    greedy speculative engine on an AVX2-only host."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _ONE_KERNEL_LIBRARY], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(loaded) <= 1, f"vLLM kernel libraries loaded: {loaded}"
