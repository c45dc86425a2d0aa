"""The peers a user would pick instead of this package, served in the same process as its engines:
- vLLM's n-gram (prompt-lookup) proposer: greedy output equals plain decoding, drafts are made,
  and an engine started after it in the same process still starts (patching.py 9);
- vLLM's own DFlash proposer for an engine started with liliprop left out of `VLLM_PLUGINS`, in a
  process where the plugin is registered: it is `VllmDFlashProposer` (vLLM's methods only), and
  its output and acceptance counters equal those of stock DFlash in a fresh process that never
  loaded the plugin (conftest `stock`), hence plain decoding;
- suffix decoding (arctic-inference), where installed: greedy output equals plain decoding.
"""

import os

import pytest

from tests.engine import generate

pytestmark = pytest.mark.vllm
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
         "prompt_lookup_max": 4}


@pytest.fixture(scope="module")
def plain(tiny_models):
    ids, _, _ = generate(tiny_models["target"], None)
    return ids


def test_ngram_is_lossless_and_a_later_engine_starts(tiny_models, plain):
    ids, counters, _ = generate(tiny_models["target"], None, extra_flags={"speculative_config": NGRAM})
    assert ids == plain
    assert counters.num_drafts > 0  # prompt lookup found matches: the identity is not vacuous
    # numba is loaded now; vLLM's kernel rebind at the next engine start used to stop on it.
    again, _, _ = generate(tiny_models["target"], None)
    assert again == plain


def test_vllm_own_dflash_without_liliprop_matches_stock(tiny_models, stock, monkeypatch):
    from vllm.v1.spec_decode.dflash import DFlashProposer

    from vllm_liliprop.vllm.plugin import register
    from vllm_liliprop.vllm.proposer import VllmDFlashProposer
    from vllm_liliprop.vllm.stock_dflash import plugins_without_liliprop

    register()  # the plugin is on in this process, as in an eval run with other systems
    monkeypatch.setenv("VLLM_PLUGINS", plugins_without_liliprop())
    ids, counters, drafter = generate(tiny_models["target"], tiny_models["draft"], num_spec=7)
    assert type(drafter) is VllmDFlashProposer
    for name in ("__init__", "load_model", "set_inputs_first_pass", "_greedy_sample",
                 "_sample_draft_tokens", "propose"):
        assert getattr(VllmDFlashProposer, name) is getattr(DFlashProposer, name), name
    reference = stock["dflash"]
    assert ids == reference["ids"]
    assert [counters.num_drafts, counters.num_draft_tokens, counters.num_accepted_tokens] == \
        reference["counters"][:3]
    assert ids == [row[:32] for row in stock["plain"]["ids"]]


def test_liliprop_is_back_for_the_next_engine(tiny_models):
    from vllm_liliprop.vllm.proposer import LiliPropProposer

    assert "VLLM_PLUGINS" not in os.environ or "liliprop" in os.environ["VLLM_PLUGINS"]
    _, _, drafter = generate(tiny_models["target"], tiny_models["draft"], num_spec=7)
    assert type(drafter) is LiliPropProposer


def test_suffix_decoding_is_lossless(tiny_models, plain):
    pytest.importorskip("arctic_inference.suffix_decoding",
                        reason="suffix decoding needs arctic-inference (docs/serving.md)")
    spec = {"method": "suffix", "num_speculative_tokens": 8}
    ids, counters, _ = generate(tiny_models["target"], None, extra_flags={"speculative_config": spec})
    assert ids == plain
    assert counters.num_drafts > 0


def test_eval_engine_without_liliprop_runs_vllm_own_proposer(tiny_models, monkeypatch):
    from tests.engine import ENGINE_FLAGS
    from vllm_liliprop.vllm.offline import OfflineEngine, in_process_drafter
    from vllm_liliprop.vllm.plugin import register
    from vllm_liliprop.vllm.proposer import VllmDFlashProposer

    register()  # as after the run's AR engine: the plugin is on in this process
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    spec = {"method": "dflash", "model": tiny_models["draft"], "num_speculative_tokens": 3}
    flags = {k: v for k, v in ENGINE_FLAGS.items() if k != "disable_log_stats"}  # OfflineEngine's own
    with OfflineEngine(tiny_models["target"], flags, spec, without_liliprop=True) as engine:
        assert type(in_process_drafter(engine.llm)) is VllmDFlashProposer
    assert "VLLM_PLUGINS" not in os.environ  # only while that engine started
