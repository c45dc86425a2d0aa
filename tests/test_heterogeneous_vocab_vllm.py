"""A draft with its own tokenizer (`speculative_config.use_heterogeneous_vocab`) and a draft rule.

vLLM maps such a draft's ids to the target's (`VocabMapping`) only inside `_greedy_sample` and
`_sample_draft_tokens`, which a rule replaces, so `LiliPropProposer` refuses the combination at
engine start. vLLM 0.32 itself accepts the flag only with method='draft_model', never for
DFlash; the proposer's check holds if a later vLLM allows it. (A reduced vocabulary of the
target's own tokenizer, `draft_vocab_size` + `d2t`, is served: tests/test_training_vllm_consistency.py.)
"""

from types import SimpleNamespace

import pytest
import torch

from vllm_liliprop.options import ENV_VAR

pytestmark = pytest.mark.vllm


def make_proposer(monkeypatch, dflash_config, use_heterogeneous_vocab=True):
    """`LiliPropProposer.__init__` on a stand-in for the parent's state: no engine needed."""
    from vllm.v1.spec_decode.dflash import DFlashProposer

    from vllm_liliprop.vllm.proposer import LiliPropProposer

    def parent_init(self, vllm_config, device, runner=None):
        self.draft_model_config = SimpleNamespace(hf_config=SimpleNamespace(
            architectures=["DFlashDraftModel"], dflash_config=dflash_config))
        self.num_speculative_tokens = 3

    monkeypatch.setattr(DFlashProposer, "__init__", parent_init)
    monkeypatch.delenv(ENV_VAR, raising=False)
    spec = SimpleNamespace(use_heterogeneous_vocab=use_heterogeneous_vocab,
                           draft_sample_method="greedy")
    return LiliPropProposer(SimpleNamespace(speculative_config=spec,
                                            scheduler_config=SimpleNamespace(async_scheduling=False)),
                            torch.device("cpu"))


def test_rule_with_heterogeneous_vocab_is_refused_at_start(monkeypatch):
    with pytest.raises(ValueError) as error:
        make_proposer(monkeypatch, {"liliprop": {"rule": "argmax"}})
    message = str(error.value)
    assert "speculative_config.use_heterogeneous_vocab = True" in message
    assert "use a draft trained with the target's tokenizer" in message


def test_without_a_rule_or_without_the_flag_nothing_is_refused(monkeypatch):
    assert make_proposer(monkeypatch, {}).liliprop_options is None  # vLLM's own paths
    proposer = make_proposer(monkeypatch, {"liliprop": {"rule": "argmax"}},
                             use_heterogeneous_vocab=False)
    assert proposer.liliprop_options.rule == "argmax"


def test_vllm_refuses_heterogeneous_vocab_for_dflash_itself(tiny_models):
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=tiny_models["target"], dtype="float32", max_model_len=512, enforce_eager=True,
        speculative_config={"method": "dflash", "model": tiny_models["draft"],
                            "num_speculative_tokens": 7, "use_heterogeneous_vocab": True},
    )
    with pytest.raises(Exception, match="use_heterogeneous_vocab only works with method='draft_model'"):
        args.create_engine_config()
