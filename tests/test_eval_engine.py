"""vllm_liliprop.vllm.offline: YaRN flags, multi-turn batches on a real engine, per-batch counters."""

import pickle

import pytest

pytestmark = [pytest.mark.vllm]


def test_yarn_flag_becomes_a_picklable_override_of_any_config():
    from transformers import Qwen3Config

    from vllm_liliprop.vllm.offline import apply_yarn, llm_kwargs

    kwargs = llm_kwargs({"dtype": "float32", "yarn": {"factor": 4}})
    assert kwargs["dtype"] == "float32" and "yarn" not in kwargs
    override = pickle.loads(pickle.dumps(kwargs["hf_overrides"]))  # spawned engines unpickle it
    config = override(Qwen3Config(max_position_embeddings=2048))
    assert config.rope_parameters["rope_type"] == "yarn"
    assert config.rope_parameters["factor"] == 4.0
    assert config.rope_parameters["original_max_position_embeddings"] == 2048
    assert config.max_position_embeddings == 8192
    config = apply_yarn(Qwen3Config(max_position_embeddings=4096), 2.0, 1024)
    assert config.max_position_embeddings == 2048
    with pytest.raises(ValueError, match="max_num_seqs"):
        llm_kwargs({"max_num_seqs": 4})
    with pytest.raises(ValueError, match="both 'yarn'/'draft_yarn' and 'hf_overrides'"):
        llm_kwargs({"yarn": {"factor": 2}, "hf_overrides": {"x": 1}})


def test_target_and_draft_get_their_own_yarn_settings():
    from transformers import Qwen3Config

    from vllm_liliprop.vllm.offline import llm_kwargs

    def extended(kwargs, architecture):
        config = kwargs["hf_overrides"](Qwen3Config(max_position_embeddings=2048, architectures=[architecture]))
        return config.max_position_embeddings

    both = llm_kwargs({"yarn": {"factor": 4}})
    assert extended(both, "Qwen3ForCausalLM") == extended(both, "DFlashDraftModel") == 8192
    apart = llm_kwargs({"yarn": {"factor": 4}, "draft_yarn": {"factor": 2}})
    assert (extended(apart, "Qwen3ForCausalLM"), extended(apart, "LiLiCorrDraftModel")) == (8192, 4096)
    target_only = llm_kwargs({"yarn": {"factor": 4}, "draft_yarn": None})
    assert (extended(target_only, "Qwen3ForCausalLM"), extended(target_only, "Qwen3DSparkModel")) == (8192, 2048)
    draft_only = llm_kwargs({"draft_yarn": {"factor": 2}})
    assert (extended(draft_only, "Qwen3ForCausalLM"), extended(draft_only, "DFlashDraftModel")) == (2048, 4096)
    assert "hf_overrides" not in llm_kwargs({"draft_yarn": None})
    with pytest.raises(ValueError, match="draft_yarn = 'x' must be an object with a number 'factor' > 0"):
        llm_kwargs({"draft_yarn": "x"})


@pytest.mark.slow
def test_multi_turn_batch_follows_own_answers_with_yarn_of_its_own_on_target_and_draft(tiny_models):
    from transformers import AutoTokenizer

    from eval.prompts import PromptRenderer
    from vllm_liliprop.vllm.offline import OfflineEngine, Sampling

    tokenizer = AutoTokenizer.from_pretrained(tiny_models["target"])
    renderer = PromptRenderer(tokenizer)
    seen = []

    def render(messages):
        seen.append([dict(m) for m in messages])
        return renderer(messages)

    spec = {"method": "dflash", "model": tiny_models["draft"], "num_speculative_tokens": 7}
    # 4096 > the tiny target's 2048 positions: only valid with the YaRN extension.
    flags = {"dtype": "float32", "max_model_len": 4096, "enforce_eager": True, "yarn": {"factor": 2.0},
             "draft_yarn": {"factor": 4.0}}
    conversations = [["def foo(x):", "and then?"], ["import os"], ["class A:", "more", "again"]]
    with OfflineEngine(tiny_models["target"], flags, spec, None, max_num_seqs=2) as engine:
        config = engine.llm.llm_engine.vllm_config
        assert config.scheduler_config.max_num_seqs == 2
        assert engine.max_model_len == 4096
        for hf, factor in ((config.model_config.hf_config, 2.0),
                           (config.speculative_config.draft_model_config.hf_config, 4.0)):
            assert hf.rope_parameters["rope_type"] == "yarn" and hf.rope_parameters["factor"] == factor
        warm = engine.run_batch(conversations, render, Sampling(0.0, 4, None, True), max_turns=1)
        assert [len(a) for a in warm.answers] == [1, 1, 1] and warm.output_tokens == 12
        seen.clear()
        result = engine.run_batch(conversations, render, Sampling(0.0, 8, None, True))
        total = engine.counters()
    assert [len(a) for a in result.answers] == [2, 1, 3]
    assert result.output_tokens == 8 * 6
    # Each later turn's prompt carries the engine's own earlier answers.
    third = [m for m in seen if m[0]["content"] == "class A:"]
    assert [len(m) for m in third] == [1, 3, 5]
    assert [m["content"] for m in third[-1] if m["role"] == "assistant"] == result.answers[2][:2]
    # The batch's counters exclude the warm-up: total = warm-up + batch.
    assert result.counters.num_drafts > 0
    assert total.num_drafts == warm.counters.num_drafts + result.counters.num_drafts
    assert result.num_steps > 0 and result.wall_s > 0


@pytest.mark.slow
def test_each_open_engine_counts_its_own_drafts(tiny_models):
    """Two speculative engines open at once (eval's side-by-side runs): each engine's counters
    are its own steps', where vLLM's process-wide metrics follow only the engine built last."""
    from transformers import AutoTokenizer

    from eval.prompts import PromptRenderer
    from vllm_liliprop.vllm.metrics import SpecDecodeCounters
    from vllm_liliprop.vllm.offline import OfflineEngine, Sampling

    render = PromptRenderer(AutoTokenizer.from_pretrained(tiny_models["target"]))
    flags = {"dtype": "float32", "max_model_len": 512, "enforce_eager": True}
    sampling = Sampling(0.0, 12, None, True)
    batch = [["def foo(x):"], ["import os"]]
    wide = {"method": "dflash", "model": tiny_models["draft"], "num_speculative_tokens": 7}
    narrow = {**wide, "num_speculative_tokens": 2}
    with OfflineEngine(tiny_models["target"], flags, wide, None, max_num_seqs=2) as first:
        alone = first.run_batch(batch, render, sampling).counters
        with OfflineEngine(tiny_models["target"], flags, narrow, None, max_num_seqs=2) as second:
            before = first.counters()
            other = second.run_batch(batch, render, sampling).counters
            assert first.counters() == before  # the second engine's steps are not the first's
            again = first.run_batch(batch, render, sampling).counters
            # The engine built last is the one vLLM's own metrics follow: both counts agree there.
            assert second.counters() == SpecDecodeCounters.read(second.llm)
    assert alone.num_drafts > 0 and alone == again
    assert len(alone.accepted_per_pos) == 7 and len(other.accepted_per_pos) == 2
    assert other.num_draft_tokens == 2 * other.num_drafts


def test_a_batch_at_concurrency_c_keeps_c_requests_in_flight_and_refills(tiny_models):
    """run_batch(concurrency=c) on an engine built for more: the requests go in c at a time,
    first come first served, as vLLM's scheduler admits them at max_num_seqs = c. Plain greedy
    steps make it countable: a request of n tokens takes n steps, so 4 requests one at a time
    take 4n steps, two at a time 2n, all at once n; the tokens are the same either way."""
    from vllm_liliprop.vllm.offline import OfflineEngine, Sampling

    flags = {"dtype": "float32", "max_model_len": 256, "enforce_eager": True}
    conversations = [["a b"], ["c d e"], ["f"], ["g h"]]

    def render(messages):
        return [5 + len(messages[0]["content"])] * 6

    sampling = Sampling(0.0, 5, None, True)
    with OfflineEngine(tiny_models["target"], flags, None, None, max_num_seqs=4) as engine:
        steps = {c: engine.run_batch(conversations, render, sampling, concurrency=c) for c in (1, 2, None)}
        with pytest.raises(ValueError, match="concurrency=0"):
            engine.run_batch(conversations, render, sampling, concurrency=0)
    assert {c: r.num_steps for c, r in steps.items()} == {1: 20, 2: 10, None: 5}
    assert steps[1].token_ids == steps[2].token_ids == steps[None].token_ids
