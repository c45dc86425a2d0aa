"""The served-ablation tools: draft variants (tools/ablation_drafts.py) and held-out suites
(tools/heldout_suite.py), on the shipped SmolLM2 drafts."""

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from tools.ablation_drafts import RANK_EMBEDDING, lilicorr_topk_variant, write_variants
from tools.heldout_suite import suite_rows
from vllm_liliprop.heads.dels_io import DelsConfig

DRAFTS = Path(__file__).resolve().parents[1] / "testbed" / "smollm2" / "round3" / "drafts"


def test_variants_change_only_what_they_name(tmp_path):
    written = write_variants(DRAFTS, tmp_path)
    assert [p.name for p in written] == ["dels_p0", "dels_p1", "dels_markov_p0", "dels_markov_p1", "lilicorr_k4"]
    for kind in ("dels", "dels_markov"):
        shipped = json.loads((DRAFTS / "dflash" / kind / "config.json").read_text())
        for p in (0, 1):
            config = json.loads((tmp_path / f"{kind}_p{p}" / "config.json").read_text())
            assert DelsConfig.from_dict(config).pure_draft_prefix_len == p
            assert {k: v for k, v in config.items() if k != "pure_draft_prefix_len"} == \
                   {k: v for k, v in shipped.items() if k != "pure_draft_prefix_len"}
            assert (tmp_path / f"{kind}_p{p}" / "model.safetensors").resolve() == \
                   (DRAFTS / "dflash" / kind / "model.safetensors").resolve()
    config = json.loads((tmp_path / "lilicorr_k4" / "config.json").read_text())
    assert config["dflash_config"]["lilicorr_candidate_topk"] == 4
    with safe_open(str(tmp_path / "lilicorr_k4" / "model.safetensors"), "pt") as new, \
         safe_open(str(DRAFTS / "lilicorr" / "model.safetensors"), "pt") as old:
        assert set(new.keys()) == set(old.keys())
        full, cut = old.get_tensor(RANK_EMBEDDING), new.get_tensor(RANK_EMBEDDING)
        assert cut.shape[-2] == 4 and full.shape[-2] == 8
        assert (cut == full[..., :4, :]).all()
        name = "lilicorr.in_head.weight"
        assert (new.get_tensor(name) == old.get_tensor(name)).all()


def test_a_larger_k_than_trained_is_refused(tmp_path):
    with pytest.raises(ValueError, match="rank embeddings for ranks 0..7"):
        lilicorr_topk_variant(DRAFTS / "lilicorr", tmp_path / "k16", 16)


def test_heldout_suite_keeps_user_turns():
    lines = [json.dumps({"id": "a", "topic": "code", "messages": [{"role": "user", "content": "Q1"}]}), "",
             json.dumps({"id": "b", "messages": [{"role": "user", "content": "Q2"},
                                                 {"role": "assistant", "content": "A"},
                                                 {"role": "user", "content": "Q3"}]})]
    assert suite_rows(lines) == [{"id": "a", "turns": ["Q1"]}, {"id": "b", "turns": ["Q2", "Q3"]}]
