"""The DSpark rule on synthetic drafter outputs (no engine): upstream's Markov-head math, top-k,
a reduced draft vocabulary, sampled drafts, faults and load errors."""

import math

import pytest
import torch

from vllm_liliprop.heads.dspark import MarkovBiasHead
from vllm_liliprop.options import LiliPropOptions, OptionError
from vllm_liliprop.rules.base import DraftInputs
from vllm_liliprop.rules.dspark import DSparkRule
from vllm_liliprop.rules.factory import RuleResources, build_rule

V, H, S, B, R = 64, 16, 5, 6, 4
SCALE = 1.5


def _setup(draft_ids=None, seed=0):
    """(inputs, head, lm_head [n, H], vocab_ids) for a random drafter and Markov head."""
    generator = torch.Generator().manual_seed(seed)
    vocab_ids = None if draft_ids is None else torch.tensor(draft_ids)
    n = V if vocab_ids is None else vocab_ids.numel()
    lm_head = torch.randn(n, H, generator=generator)
    head = MarkovBiasHead(V, n, R, scale=SCALE)
    with torch.no_grad():
        head.markov_w1.weight.copy_(torch.randn(V, R, generator=generator))
        head.markov_w2.weight.copy_(torch.randn(n, R, generator=generator) * 2.0)

    def draft_logits(hidden):
        return SCALE * hidden @ lm_head.T

    def full_logits(hidden):  # vLLM's compute_logits: draft logits scattered into V, -inf elsewhere
        logits = draft_logits(hidden)
        if vocab_ids is None:
            return logits
        return torch.full((hidden.shape[0], V), -math.inf).index_copy_(-1, vocab_ids, logits)

    inputs = DraftInputs(
        hidden=torch.randn(B, S, H, generator=generator),
        anchor_ids=torch.randint(0, V, (B,), generator=generator),
        compute_logits=full_logits,
        embed=None,
        draft_vocab_logits=None if vocab_ids is None else draft_logits,
    )
    return inputs, head, lm_head, vocab_ids


def _upstream_head(head: MarkovBiasHead):
    """vLLM's own DSparkMarkovHead with our head's weights."""
    from vllm.model_executor.models.qwen3_dspark import DSparkMarkovHead

    n, rank = head.markov_w2.weight.shape
    upstream = DSparkMarkovHead(head.markov_w1.weight.shape[0], n, rank, prefix="markov_head")
    upstream.markov_w1.weight.data.copy_(head.markov_w1.weight)
    # ParallelLMHead pads its rows to a multiple of 64: the draft ids are the first n.
    upstream.markov_w2.weight.data[:n].copy_(head.markov_w2.weight)
    return upstream


def _upstream_drafts(inputs, lm_head, upstream, vocab_ids, topk=None):
    """Upstream's sequential loop (V2 DSparkSpeculator, greedy) on the same base logits.

    Its dense path adds `logits_processor(markov_w2, embed)`, which needs a running vLLM (the
    engine tests use it); its top-k path is plain torch: `apply_bias_gathered` over each slot's
    top-k base candidates. With k = n every id is a candidate, which is the dense bias."""
    base = SCALE * inputs.hidden @ lm_head.T
    n = base.shape[-1]
    k = n if topk is None else topk
    values, index = base.topk(k, dim=-1)
    prev = inputs.anchor_ids
    drafts = []
    for slot in range(base.shape[1]):
        logits = torch.full((base.shape[0], n), -math.inf)
        logits = upstream.apply_bias_gathered(upstream.embed(prev), logits, values[:, slot],
                                              index[:, slot], scale=SCALE)
        draft = logits.argmax(-1)
        prev = draft if vocab_ids is None else vocab_ids[draft]
        drafts.append(prev)
    return torch.stack(drafts, 1), base


@pytest.mark.parametrize("topk", [None, 3])
@pytest.mark.parametrize("reduced", [False, True], ids=["full-vocab", "reduced-vocab"])
def test_greedy_drafts_equal_upstream_markov_head(topk, reduced):
    inputs, head, lm_head, vocab_ids = _setup(list(range(0, V, 2)) if reduced else None)
    rule = DSparkRule(head, V, topk=topk, vocab_ids=vocab_ids)
    out = rule.propose(inputs)
    reference, base = _upstream_drafts(inputs, lm_head, _upstream_head(head), vocab_ids, topk)
    assert torch.equal(out.token_ids, reference)
    vanilla = base.argmax(-1) if vocab_ids is None else vocab_ids[base.argmax(-1)]
    assert torch.equal(out.fallback_ids, vanilla)
    assert (out.token_ids != vanilla).float().mean() > 0.3  # the head matters
    assert not out.faulty_rows.any() and out.probs is None
    assert rule.name == "dspark" + ("" if topk is None else f"-top{topk}")


@pytest.mark.parametrize("reduced", [False, True], ids=["full-vocab", "reduced-vocab"])
def test_sampled_drafts_come_from_the_returned_sequential_distributions(reduced):
    inputs, head, lm_head, vocab_ids = _setup(list(range(1, V, 3)) if reduced else None, seed=1)
    temperature = torch.tensor([1.0, 0.0, 0.7, 1.0, 1.3, 0.0])
    inputs.temperature = temperature
    rule = DSparkRule(head, V, sampling="probabilistic", vocab_ids=vocab_ids)
    torch.manual_seed(0)
    out = rule.propose(inputs)
    assert out.probs.shape == (B, S, V)
    torch.testing.assert_close(out.probs.sum(-1), torch.ones(B, S))
    assert (out.probs.gather(-1, out.token_ids[..., None]) > 0).all()
    if vocab_ids is not None:
        outside = torch.ones(V, dtype=torch.bool).index_fill_(0, vocab_ids, False)
        assert (out.probs[..., outside] == 0).all()
    # Each slot's distribution is softmax((base + bias(previous draft)) / T) ...
    base = SCALE * inputs.hidden @ lm_head.T
    prev = torch.cat([inputs.anchor_ids[:, None], out.token_ids[:, :-1]], 1)
    scores = base + head.teacher_forced(prev, inputs.hidden).detach()
    for b in (0, 2, 3, 4):
        q = torch.softmax(scores[b] / temperature[b], -1)
        expected = q if vocab_ids is None else torch.zeros(S, V).index_copy_(-1, vocab_ids, q)
        torch.testing.assert_close(out.probs[b], expected)
    # ... and greedy requests of the batch get the deterministic drafts, one-hot.
    greedy = DSparkRule(head, V, vocab_ids=vocab_ids).propose(inputs).token_ids
    for b in (1, 5):
        assert torch.equal(out.token_ids[b], greedy[b])
        assert torch.equal(out.probs[b].argmax(-1), greedy[b]) and (out.probs[b].max(-1).values == 1).all()
    # Deterministic sampling option: the batch's temperatures are ignored.
    assert torch.equal(DSparkRule(head, V, vocab_ids=vocab_ids).propose(inputs).token_ids, greedy)


def test_nan_in_the_head_flags_only_rows_that_reach_it():
    inputs, head, lm_head, _ = _setup()
    anchor = int(inputs.anchor_ids[0])
    inputs.anchor_ids[1:] = torch.where(inputs.anchor_ids[1:] == anchor, (anchor + 1) % V,
                                        inputs.anchor_ids[1:])
    rule = DSparkRule(head, V)
    clean = rule.propose(inputs)
    with torch.no_grad():
        head.markov_w1.weight[anchor] = float("nan")
    out = rule.propose(inputs)
    assert out.faulty_rows[0]
    assert torch.equal(out.fallback_ids, (SCALE * inputs.hidden @ lm_head.T).argmax(-1))
    # A row faults exactly when some slot's previous token is the NaN row: its anchor (row 0
    # only) or one of its drafts before the last slot; the others draft as before.
    untouched = ~(clean.token_ids[:, :-1] == anchor).any(-1)
    untouched[0] = False
    assert torch.equal(out.faulty_rows, ~untouched)
    assert torch.equal(out.token_ids[untouched], clean.token_ids[untouched])


def _resources(tmp_path, state, **config):
    return RuleResources(draft_dir=tmp_path, vocab_size=V, device=torch.device("cpu"),
                         dtype=torch.float32, markov_state_dict=state, draft_hf_config=config)


def test_from_resources_reads_scale_and_topk(tmp_path):
    _, head, _, _ = _setup()
    state = {name: value.to(torch.bfloat16) for name, value in head.state_dict().items()}
    rule = build_rule(LiliPropOptions(rule="dspark"), _resources(tmp_path, state, logit_scale=2.5,
                                                                dspark_draft_topk=7))
    assert isinstance(rule, DSparkRule) and rule.name == "dspark-top7"
    assert rule.head.scale == 2.5 and rule.head.markov_w1.weight.dtype == torch.float32
    rule = build_rule(LiliPropOptions(rule="dspark", sampling="probabilistic"),
                      _resources(tmp_path, state, dspark_draft_topk=None))
    assert rule.name == "dspark-sampled" and rule.head.scale == 1.0 and rule.topk is None


def test_from_resources_errors_name_the_file_and_field(tmp_path):
    options = LiliPropOptions(rule="dspark")
    with pytest.raises(OptionError, match=r"markov_head\.markov_w1\.weight.*") as info:
        build_rule(options, _resources(tmp_path, None))
    assert str(tmp_path) in str(info.value)
    _, head, _, _ = _setup()
    state = dict(head.state_dict())
    with pytest.raises(OptionError, match="missing"):
        build_rule(options, _resources(tmp_path, {"markov_w1.weight": state["markov_w1.weight"]}))
    with pytest.raises(OptionError, match="another vocabulary"):
        build_rule(options, _resources(tmp_path, {**state, "markov_w2.weight": torch.zeros(V - 1, R)}))
    bad = {**state, "markov_w2.weight": state["markov_w2.weight"].clone().fill_(float("nan"))}
    with pytest.raises(ValueError, match=r"markov_head\.markov_w2\.weight.*NaN"):
        build_rule(options, _resources(tmp_path, bad))
    with pytest.raises(OptionError, match="dspark_draft_topk"):
        build_rule(options, _resources(tmp_path, state, dspark_draft_topk=0))


def test_checkpoint_helpers(tmp_path):
    from safetensors.torch import save_file
    from transformers import Qwen3Config

    from vllm_liliprop.vllm.patching import _copy_dspark_target_layers
    from vllm_liliprop.vllm.proposer import read_head_weights, samples_from_anchor

    w = torch.ones(3, 2)
    save_file({"model.markov_head.markov_w1.weight": w, "markov_head.markov_w2.weight": 2 * w,
               "fc.weight": w.clone(), "lilicorr.x": w.clone()}, str(tmp_path / "model.safetensors"))
    assert sorted(read_head_weights(tmp_path, "markov_head.")) == ["markov_w1.weight", "markov_w2.weight"]
    assert list(read_head_weights(tmp_path, "lilicorr.")) == ["x"]
    config = Qwen3Config(architectures=["Qwen3DSparkModel"])
    assert samples_from_anchor(config)  # upstream's default when the field is absent
    config.sample_from_anchor = False
    assert not samples_from_anchor(config)
    assert not samples_from_anchor(Qwen3Config(architectures=["DFlashDraftModel"]))
    config = Qwen3Config(target_layer_ids=[0, 2], dflash_config={"mask_token_id": 5})
    _copy_dspark_target_layers(config)
    assert config.dflash_config == {"mask_token_id": 5, "target_layer_ids": [0, 2]}
    config = Qwen3Config(dspark_target_layer_ids=[1], dflash_config={"target_layer_ids": [3]})
    _copy_dspark_target_layers(config)
    assert config.dflash_config == {"target_layer_ids": [3]}


def test_bf16_export_keeps_d2t(tmp_path):
    """A bf16 export keeps d2t int64: bf16 rounds integers above 256, which once sent most of
    a 16,384-id draft vocabulary to the wrong target ids."""
    from safetensors.torch import load_file

    from training.drafter import DFlashDrafter, DrafterConfig
    from training.export import export_dflash, export_dspark, read_draft_vocab

    config = DrafterConfig(vocab_size=1024, hidden_size=32, intermediate_size=64,
                           num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                           head_dim=16, target_layer_ids=[0], mask_token_id=5, block_size=4)
    ids = torch.arange(0, 1024, 2)
    head = MarkovBiasHead(1024, ids.numel(), 2)
    export = export_dspark(tmp_path / "dspark", DFlashDrafter(config), head,
                           draft_vocab=(ids, torch.randn(1024, 32)))
    assert torch.equal(read_draft_vocab(export), ids)
    export = export_dflash(tmp_path / "dflash", DFlashDrafter(config),
                           draft_vocab=(ids, torch.randn(1024, 32)))
    assert load_file(str(export / "model.safetensors"))["d2t"].dtype == torch.int64
    assert torch.equal(read_draft_vocab(export), ids)


def test_config_patches_serve_qwen3_dspark_on_v1_only(monkeypatch):
    """Patches 6 and 7 of vllm_liliprop/vllm/patching.py on stand-in configs: method 'dspark'
    becomes 'dflash' for Qwen3DSparkModel (target layers copied into dflash_config), and
    EAGLEConfig's 'DFlashQwen3DSparkModel' keeps the DSpark name; neither with V2 forced, nor
    for another architecture."""
    from types import SimpleNamespace

    from vllm_liliprop.vllm.patching import _wrap_eagle_config_init, _wrap_speculative_post_init

    def spec(method, arch="Qwen3DSparkModel"):
        hf = SimpleNamespace(target_layer_ids=[1, 3], dflash_config={"mask_token_id": 9})
        return SimpleNamespace(method=method, draft_model_config=SimpleNamespace(
            architectures=[arch], hf_config=hf))

    post_init = _wrap_speculative_post_init(lambda self: None)
    init = _wrap_eagle_config_init(
        lambda self, model: setattr(self, "architectures", ["DFlash" + a for a in model]))
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    for method in ("dspark", "dflash"):
        config = spec(method)
        post_init(config)
        assert config.method == "dflash"
        assert config.draft_model_config.hf_config.dflash_config == {"mask_token_id": 9,
                                                                     "target_layer_ids": [1, 3]}
    for config in (spec("dspark", "Gemma4DSparkModel"), spec("eagle3")):
        method = config.method
        post_init(config)
        assert config.method == method
    eagle = SimpleNamespace()
    init(eagle, ["Qwen3DSparkModel"])
    assert eagle.architectures == ["Qwen3DSparkModel"]
    init(eagle, ["Qwen3ForCausalLM"])
    assert eagle.architectures == ["DFlashQwen3ForCausalLM"]

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    config = spec("dspark")
    post_init(config)
    assert config.method == "dspark" and "target_layer_ids" not in config.draft_model_config.hf_config.dflash_config
    init(eagle, ["Qwen3DSparkModel"])
    assert eagle.architectures == ["DFlashQwen3DSparkModel"]


def test_config_patches_apply_once():
    from vllm.config import SpeculativeConfig
    from vllm.transformers_utils.configs.eagle import EAGLEConfig

    from vllm_liliprop.vllm import patching, plugin

    plugin.register()
    patched = SpeculativeConfig.__dict__["__post_init__"], EAGLEConfig.__dict__["__init__"]
    patching.apply_patches()
    assert (SpeculativeConfig.__dict__["__post_init__"], EAGLEConfig.__dict__["__init__"]) == patched
    for function in patched:
        original = getattr(function, "__liliprop_original__")
        assert getattr(original, "__liliprop_original__", None) is None
