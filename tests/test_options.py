"""Draft-rule options: sources, precedence and error messages (no vLLM needed)."""

import json

import pytest

from vllm_liliprop.options import ENV_VAR, OptionError, resolve_options


# A LiLiCorr checkpoint's head fields: resolve_options checks them before vLLM reads them.
LILICORR = {
    "lilicorr_candidate_topk": 4, "lilicorr_hidden_size": 0, "lilicorr_num_layers": 1,
    "lilicorr_num_heads": 4, "lilicorr_mlp_ratio": 2.0, "lilicorr_factor_dim": 32,
    "lilicorr_vector_eps": 1e-6, "lilicorr_logit_scale": 8.0,
}


def env(**options):
    return {ENV_VAR: json.dumps(options)}


def test_plain_dflash_is_left_alone():
    assert resolve_options(["DFlashDraftModel"], {"mask_token_id": 3}, environ={}) is None


def test_lilicorr_architecture_defaults_to_lattice_greedy():
    options = resolve_options(["LiLiCorrDraftModel"], LILICORR, environ={})
    assert (options.rule, options.walk, options.sampling) == ("lattice", "greedy", "deterministic")
    assert options.sources == {"rule": "architecture"}


def test_environment_overrides_checkpoint_which_overrides_defaults():
    block = {**LILICORR, "liliprop": {"walk": "viterbi", "dels_alpha": [0.1, 0.2]}}
    options = resolve_options(["LiLiCorrDraftModel"], block, environ=env(walk="greedy"))
    assert options.walk == "greedy" and options.sources["walk"] == ENV_VAR
    assert options.dels_alpha == (0.1, 0.2) and options.sources["dels_alpha"] == "checkpoint"


def test_draft_sample_method_selects_probabilistic_sampling():
    options = resolve_options(["LiLiCorrDraftModel"], LILICORR, "probabilistic", environ={})
    assert options.sampling == "probabilistic"


@pytest.mark.parametrize(
    "block, message",
    [
        ({"walk": "zigzag"}, "dflash_config.liliprop.walk = 'zigzag' is not valid; use one of greedy, viterbi"),
        ({"rule": "bogus"}, "dflash_config.liliprop.rule = 'bogus' is not valid"),
        ({"sampling": "maybe"}, "dflash_config.liliprop.sampling"),
        ({"dels_alpha": "high"}, "dflash_config.liliprop.dels_alpha"),
        ({"dels_beta": []}, "dflash_config.liliprop.dels_beta"),
        ({"wlak": "greedy"}, "unknown field(s) ['wlak']"),
    ],
)
def test_bad_checkpoint_block_names_the_field(block, message):
    with pytest.raises(OptionError) as error:
        resolve_options(["LiLiCorrDraftModel"], {**LILICORR, "liliprop": block}, environ={})
    assert message in str(error.value)


def test_bad_environment_names_the_variable():
    with pytest.raises(OptionError, match=f"{ENV_VAR}.walk"):
        resolve_options(["DFlashDraftModel"], {}, environ=env(walk="zigzag"))
    with pytest.raises(OptionError, match="not valid JSON"):
        resolve_options(["DFlashDraftModel"], {}, environ={ENV_VAR: "{walk: viterbi"})


def test_lattice_rule_needs_a_lilicorr_checkpoint():
    with pytest.raises(OptionError, match="needs a LiLiCorr head"):
        resolve_options(["DFlashDraftModel"], {"liliprop": {"rule": "lattice"}}, environ={})
