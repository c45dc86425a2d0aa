"""Upstream-format DSpark drafts (`Qwen3DSparkModel`) served on vLLM's V1 runner by this package.

Each engine checks several things at once (an engine start costs 20-40 s here):
- greedy output equals plain decoding, for both layouts (sample_from_anchor true / false) and
  both ways of asking (method "dspark", or none, which vLLM detects as "dspark"; and "dflash");
- every drafted block equals a reference computed with upstream's own modules of the loaded
  `Qwen3DSparkForCausalLM` on the same hidden states (`compute_draft_logits`, `markov_embed`,
  `markov_bias` through its logits processor, `apply_markov_bias_gathered` for top-k,
  `map_draft_to_target`), in the loop of upstream's V2 `DSparkSpeculator`, and differs from
  the drafter's plain argmax (the head matters);
- the anchor layout feeds the drafter [anchor, mask x (N-1)] at positions last+1 .. last+N and
  samples all N queries;
- an `export_dspark` checkpoint loads through upstream's loader unchanged;
- a NaN Markov head falls back to the drafter's argmax without changing the output;
- sampled DSpark at T = 1 keeps the target's distribution.
"""

import math
from collections import Counter

import pytest
import torch

from tests.builders import build_tiny_dspark
from tests.engine import generate
from vllm_liliprop.fixtures import build_tiny_target

pytestmark = pytest.mark.vllm
K = 7


@pytest.fixture(scope="module")
def plain(tiny_models):
    ids, _, _ = generate(tiny_models["target"], None)
    return ids


def upstream_reference(model, inputs, topk=None):
    """(drafts, argmax drafts) [B, S] from upstream's Qwen3DSparkForCausalLM methods, greedy."""
    b, s, h = inputs.hidden.shape
    base = model.compute_draft_logits(inputs.hidden.reshape(b * s, h)).view(b, s, -1)
    if topk is not None:
        values, index = base.topk(topk, dim=-1)
        truncated = torch.full_like(base, -math.inf)
    prev = inputs.anchor_ids
    drafts = []
    for slot in range(s):
        embed = model.markov_embed(prev)
        if topk is None:
            logits = base[:, slot] + model.markov_bias(embed)
        else:
            logits = model.apply_markov_bias_gathered(embed, truncated[:, slot], values[:, slot],
                                                      index[:, slot])
        prev = model.map_draft_to_target(logits.argmax(dim=-1))
        drafts.append(prev)
    return torch.stack(drafts, 1), model.map_draft_to_target(base.argmax(dim=-1))


class Recorder:
    """A `generate(prepare=...)` hook: keeps each step's drafts next to upstream's reference, and
    what the drafter was fed (query ids, positions, sampled rows)."""

    def __init__(self):
        self.blocks = []
        self.steps = []

    def __call__(self, drafter):
        rule, model = drafter.draft_rule, drafter.model
        propose = rule.propose

        def recording_propose(inputs):
            out = propose(inputs)
            reference, vanilla = upstream_reference(model, inputs, rule.topk)
            self.blocks.append((out.token_ids.clone(), reference, vanilla))
            return out

        rule.propose = recording_propose
        first_pass = drafter.set_inputs_first_pass

        def recording_first_pass(**kwargs):
            num, indices, cad = first_pass(**kwargs)
            batch = kwargs["cad"].batch_size()
            ends = kwargs["cad"].query_start_loc[1 : batch + 1].long()
            if kwargs["num_rejected_tokens_gpu"] is not None:
                ends = ends - kwargs["num_rejected_tokens_gpu"][:batch].long()
            self.steps.append(dict(
                num=num, batch=batch, indices=indices.clone().long(),
                input_ids=drafter.input_ids[:num].clone(), positions=drafter.positions[:num].clone(),
                anchors=kwargs["next_token_ids"][:batch].clone(),
                last=kwargs["target_positions"][ends - 1].clone(),
            ))
            return num, indices, cad

        drafter.set_inputs_first_pass = recording_first_pass

    def check_drafts(self, min_changed=0.2):
        ours, reference, vanilla = (torch.cat(x) for x in zip(*self.blocks))
        assert torch.equal(ours, reference)
        assert (ours != vanilla).float().mean() > min_changed

    def check_layout(self, drafter, anchor_layout):
        mask = drafter.parallel_drafting_token_id
        queries = K if anchor_layout else K + 1
        for step in self.steps:
            batch = step["batch"]
            assert step["num"] == batch * queries
            ids = step["input_ids"].view(batch, queries)
            assert torch.equal(ids[:, 0].long(), step["anchors"].long())
            assert (ids[:, 1:] == mask).all()
            expected = step["last"][:, None] + 1 + torch.arange(queries)
            assert torch.equal(step["positions"].view(batch, queries), expected)
            rows = torch.arange(batch * queries).view(batch, queries)
            sampled = rows if anchor_layout else rows[:, 1:]
            assert torch.equal(step["indices"], sampled.reshape(-1))


def run(tiny_models, draft, method, recorder, **kwargs):
    ids, counters, drafter = generate(tiny_models["target"], draft, num_spec=K,
                                      spec_extra={"method": method, **kwargs.pop("spec", {})},
                                      prepare=recorder, **kwargs)
    assert type(drafter).__name__ == "LiliPropProposer"
    assert drafter.vllm_config.speculative_config.method == "dflash"
    assert drafter.num_rule_faults == 0
    assert counters.num_drafts > 0
    return ids, drafter


@pytest.mark.parametrize("layout,method", [("anchor", "dspark"), ("fill-in", "dflash"),
                                           ("anchor", None)],
                         ids=["anchor-dspark", "fill-in-dflash", "anchor-autodetect-top3"])
def test_greedy_equals_plain_and_drafts_equal_upstream(tiny_models, plain, layout, method):
    anchor = layout == "anchor"
    topk = 3 if method is None else None
    # The auto-detected one also ships a confidence head (adaptive verification, V2 only):
    # upstream's loader reads it, the rule ignores it.
    draft = build_tiny_dspark(tiny_models["root"] / f"dspark-{layout}-{method}",
                              tiny_models["target"], sample_from_anchor=anchor,
                              confidence_head=method is None)
    recorder = Recorder()
    ids, drafter = run(tiny_models, draft, method, recorder,
                       spec={} if topk is None else {"dspark_draft_topk": topk})
    assert drafter.anchor_layout is anchor
    assert (drafter.model.model.confidence_head is not None) is (method is None)
    assert drafter.draft_rule.name == "dspark" + ("" if topk is None else f"-top{topk}")
    assert ids == plain
    recorder.check_drafts()
    recorder.check_layout(drafter, anchor)


def test_exported_checkpoint_loads_in_vllm_unchanged(tiny_models, plain):
    """`training.export.export_dspark` output (reduced vocabulary, fill-in layout as trained) goes
    through upstream's Qwen3DSparkForCausalLM loader as written, method 'dspark'."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer

    from training.drafter import DFlashDrafter, DrafterConfig
    from training.export import export_dspark
    from vllm_liliprop.heads.dspark import MarkovBiasHead

    target_dir = tiny_models["target"]
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    config = DrafterConfig.from_target(AutoConfig.from_pretrained(target_dir),
                                       mask_token_id=tokenizer.convert_tokens_to_ids("<|mask|>"),
                                       num_hidden_layers=1, target_layer_ids=[1, 3], block_size=8)
    torch.manual_seed(0)
    drafter_module = DFlashDrafter(config)
    draft_ids = torch.arange(0, config.vocab_size, 2)
    head = MarkovBiasHead(config.vocab_size, draft_ids.numel(), 4)
    torch.nn.init.normal_(head.markov_w1.weight)
    torch.nn.init.normal_(head.markov_w2.weight, std=2.0)
    lm_head = load_file(f"{target_dir}/model.safetensors")
    lm_head = lm_head.get("lm_head.weight", lm_head["model.embed_tokens.weight"])
    export = export_dspark(tiny_models["root"] / "dspark-exported", drafter_module, head,
                           draft_vocab=(draft_ids, lm_head))  # bf16, the default
    recorder = Recorder()
    ids, drafter = run(tiny_models, export, "dspark", recorder)
    assert not drafter.anchor_layout and drafter.draft_rule.name == "dspark"
    assert torch.equal(drafter.draft_rule.vocab_ids.cpu(), draft_ids)
    loaded = drafter.model.model.markov_head
    written = load_file(str(export / "model.safetensors"))
    assert written["d2t"].dtype == torch.int64
    assert torch.equal(loaded.markov_w1.weight.float(), written["markov_head.markov_w1.weight"].float())
    assert torch.equal(loaded.markov_w2.weight[: draft_ids.numel()].float(),
                       written["markov_head.markov_w2.weight"].float())
    assert ids == plain
    recorder.check_drafts()
    recorder.check_layout(drafter, False)


def test_nan_markov_head_falls_back_to_the_drafter_argmax(tiny_models, plain):
    draft = build_tiny_dspark(tiny_models["root"] / "dspark-nan", tiny_models["target"])
    drafts = []

    def poison(drafter):
        with torch.inference_mode():
            drafter.draft_rule.head.markov_w2.weight.fill_(math.nan)
        sample = drafter._sample_draft_tokens

        def recording_sample(hidden_states, sampling_metadata):
            ids, probs = sample(hidden_states, sampling_metadata)
            drafts.append((ids.clone(), drafter._greedy_sample(hidden_states)))
            return ids, probs

        drafter._sample_draft_tokens = recording_sample

    ids, counters, drafter = generate(tiny_models["target"], draft, num_spec=K,
                                      spec_extra={"method": "dflash"}, prepare=poison)
    assert drafter.anchor_layout and drafter.num_rule_faults > 0 and counters.num_drafts > 0
    assert ids == plain
    ours, argmax = (torch.cat(x) for x in zip(*drafts))
    assert torch.equal(ours, argmax)


N = 1500
PROMPT = "x = "


def test_sampled_dspark_keeps_the_target_distribution(tiny_models):
    """T = 1 on a peaky target (one token ~70% of the mass), drafts sampled from the Markov-
    corrected distributions (a head favouring the target's two most frequent tokens, so drafts
    are accepted often and rejected often): the joint distribution of three sampled tokens
    matches plain sampling (chi-square on independent seeds; see tests/test_sampling_vllm.py for
    the test's power)."""
    from eval.distribution import chi_square_p

    root = tiny_models["root"]
    target = build_tiny_target(root / "dspark-peaky-target", logit_gain=16.0)
    plain_samples, _, _ = generate(target, None, prompts=[PROMPT] * N, max_tokens=3,
                                   temperature=1.0, seeds=list(range(N)))
    ranked = [t for t, _ in Counter(t for ys in plain_samples for t in ys[1:]).most_common(2)]
    draft = build_tiny_dspark(root / "dspark-peaky", target, favourites=ranked, strength=8.0,
                              flat_drafter=True)
    spec, counters, drafter = generate(
        target, draft, num_spec=K, prompts=[PROMPT] * N, max_tokens=3, temperature=1.0,
        seeds=list(range(N, 2 * N)),
        spec_extra={"method": "dspark", "draft_sample_method": "probabilistic"},
    )
    assert drafter.draft_rule.name == "dspark-sampled" and drafter.anchor_layout
    assert drafter.num_rule_faults == 0
    assert drafter.take_last_draft_probs() is not None
    assert 0.1 * counters.num_drafts < counters.num_accepted_tokens < counters.num_draft_tokens
    assert chi_square_p(spec, plain_samples) > 1e-3


def test_dspark_in_default_multiprocess_mode(tiny_models, plain):
    """Spawned engine-core process: the method rewrite happens where the config is built, the
    proposer is patched in the engine's own process; greedy output still equals plain."""
    from tests.engine import run_in_subprocess

    draft = build_tiny_dspark(tiny_models["root"] / "dspark-multiprocess", tiny_models["target"])
    code = """
import json, os
from vllm import LLM, SamplingParams
from tests.engine import ENGINE_FLAGS, PROMPTS
llm = LLM(model=os.environ["TARGET"], speculative_config={"method": "dspark",
          "model": os.environ["DRAFT"], "num_speculative_tokens": 7}, **ENGINE_FLAGS)
out = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True), use_tqdm=False)
print("RESULT=" + json.dumps({"ids": [list(o.outputs[0].token_ids) for o in out],
      "method": llm.llm_engine.vllm_config.speculative_config.method}))
"""
    result = run_in_subprocess(code, {"TARGET": tiny_models["target"], "DRAFT": str(draft),
                                      "VLLM_ENABLE_V1_MULTIPROCESSING": "1"})
    assert result["method"] == "dflash"
    assert result["ids"] == plain
