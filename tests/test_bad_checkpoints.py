"""Bad checkpoints are refused at load, with the file or field named and the fix (plain torch).

`load()` does what `LiliPropProposer` does at engine start once vLLM has loaded the drafter:
resolve the options from the draft's config.json (which also checks the LiLiCorr head fields,
before vLLM's own LiLiCorr model reads them), then build the draft rule, which loads the LiLiCorr
head from the lilicorr.* tensors and the DeLS head from dels/. The base draft is a LiLiCorr
checkpoint running `lattice+dels` with a GRU DeLS head, so every load path runs; each case
breaks one thing. The cases only vLLM's loader sees (the drafter's own files) are in
tests/test_bad_checkpoints_vllm.py. The table with each message is in docs/serving.md, "Bad
checkpoints"; `python -m pytest tests/test_bad_checkpoints.py -q -s -k print_table` prints it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from vllm_liliprop.heads.dels import GRUShortHead, UnigramPrior
from vllm_liliprop.heads.dels_io import DelsConfig, save_dels_head
from vllm_liliprop.heads.lattice import LatticeConfig, LatticeHead
from vllm_liliprop.options import ENV_VAR, resolve_options
from vllm_liliprop.rules.factory import RuleResources, build_rule

V, H, BLOCK = 32, 16, 8
FINGERPRINT = "sha256:target-tokenizer"
EMBED = torch.randn(V, H, generator=torch.Generator().manual_seed(0))
HEAD_FIELDS = {
    "lilicorr_candidate_topk": 4, "lilicorr_hidden_size": 0, "lilicorr_num_layers": 1,
    "lilicorr_num_heads": 4, "lilicorr_mlp_ratio": 2.0, "lilicorr_factor_dim": 8,
    "lilicorr_vector_eps": 1e-6, "lilicorr_logit_scale": 8.0,
}


def build_draft(root: Path) -> Path:
    """A LiLiCorr draft folder as the plugin reads it: config.json, the lilicorr.* tensors (the
    backbone is vLLM's to load and is left out) and a GRU DeLS head in dels/."""
    draft = root / "draft"
    draft.mkdir(parents=True)
    config = {
        "architectures": ["LiLiCorrDraftModel"], "vocab_size": V, "hidden_size": H,
        "rms_norm_eps": 1e-6,
        "dflash_config": {"block_size": BLOCK, "mask_token_id": 3, "target_layer_ids": [0],
                          **HEAD_FIELDS, "liliprop": {"rule": "lattice+dels"}},
    }
    (draft / "config.json").write_text(json.dumps(config))
    head = LatticeHead(LatticeConfig.from_dflash_config(HEAD_FIELDS, H, BLOCK, 1e-6))
    head.init_weights(torch.Generator().manual_seed(1))
    save_file({f"lilicorr.{k}": v.contiguous() for k, v in head.state_dict().items()},
              str(draft / "model.safetensors"))
    gru = GRUShortHead(EMBED, hidden_size=8, rank=4)
    prior = UnigramPrior.from_counts(torch.arange(V, dtype=torch.float64))
    save_dels_head(draft / "dels", gru, prior,
                   DelsConfig.for_head(gru, prior, tokenizer_fingerprint=FINGERPRINT))
    return draft


def load(draft: Path, environ: dict | None = None):
    """The plugin's load path without vLLM: options, then the rule with its heads."""
    config = json.loads((draft / "config.json").read_text())
    dflash_config = config["dflash_config"]
    options = resolve_options(config["architectures"], dflash_config, environ=environ or {})
    lattice = {k.removeprefix("lilicorr."): v
               for k, v in load_file(str(draft / "model.safetensors")).items()
               if k.startswith("lilicorr.")}
    resources = RuleResources(
        draft_dir=draft, vocab_size=V, device=torch.device("cpu"), dtype=torch.float32,
        embed_weight=EMBED, dflash_config=dflash_config, block_size=BLOCK, num_slots=BLOCK - 1,
        draft_hidden_size=H, rms_norm_eps=1e-6, lattice_state_dict=lattice,
        tokenizer_fingerprint=FINGERPRINT,
    )
    return build_rule(options, resources)


# ---------------------------------------------------------------- ways to break a draft

def edit_json(relative: str, edit):
    def breaker(draft: Path):
        path = draft / relative
        data = json.loads(path.read_text())
        edit(data)
        path.write_text(json.dumps(data))
    return breaker


def liliprop(**fields):
    return edit_json("config.json", lambda c: c["dflash_config"]["liliprop"].update(fields))


def head_field(name, value=None, drop=False):
    def edit(c):
        if drop:
            del c["dflash_config"][f"lilicorr_{name}"]
        else:
            c["dflash_config"][f"lilicorr_{name}"] = value
    return edit_json("config.json", edit)


def dels_field(**fields):
    return edit_json("dels/config.json", lambda c: c.update(fields))


def edit_tensors(relative: str, edit):
    def breaker(draft: Path):
        path = draft / relative
        tensors = load_file(str(path))
        edit(tensors)
        save_file(tensors, str(path))
    return breaker


def set_tensor(relative, name, make):
    return edit_tensors(relative, lambda t: t.__setitem__(name, make(t[name])))


def nan_at(tensor):
    tensor = tensor.clone()
    tensor.view(-1)[0] = math.nan
    return tensor


def truncate(relative):
    def breaker(draft):
        path = draft / relative
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return breaker


def overwrite(relative, data: bytes):
    return lambda draft: (draft / relative).write_bytes(data)


def remove(relative):
    return lambda draft: (draft / relative).unlink()


DELS_W, DELS_CFG = "dels/model.safetensors", "dels/config.json"

# (case, how to break the draft, [substrings the message must hold], environment)
CASES = [
    # DeLS head files
    ("dels weights truncated", truncate(DELS_W),
     ["dels/model.safetensors cannot be read as safetensors", "truncated or damaged",
      "re-export"], None),
    ("dels weights not safetensors", overwrite(DELS_W, b"\x00garbage" * 8),
     ["dels/model.safetensors cannot be read as safetensors", "re-export"], None),
    ("dels weights missing", remove(DELS_W),
     ["dels/model.safetensors is missing", "re-export"], None),
    ("dels tensor missing", edit_tensors(DELS_W, lambda t: t.pop("gru.weight_hh_l0")),
     ["dels/model.safetensors", "missing ['gru.weight_hh_l0']", "re-export"], None),
    ("dels tensor extra", edit_tensors(DELS_W, lambda t: t.update(extra=torch.zeros(2))),
     ["dels/model.safetensors", "unexpected ['extra']", "re-export"], None),
    ("dels tensor wrong shape", set_tensor(DELS_W, "to_rank.weight", lambda w: w[:, :-1].clone()),
     ["dels/model.safetensors", "'to_rank.weight' has shape (4, 7)",
      "config.json and the weights disagree"], None),
    ("dels tensor wrong dtype", set_tensor(DELS_W, "rank_to_vocab.weight", lambda w: w.long()),
     ["dels/model.safetensors", "'rank_to_vocab.weight' is torch.int64", "re-export"], None),
    ("dels tensor NaN", set_tensor(DELS_W, "gru.weight_ih_l0", nan_at),
     ["dels/model.safetensors", "'gru.weight_ih_l0' holds 1 NaN/Inf", "retrain or re-export"],
     None),
    ("dels prior NaN", set_tensor(DELS_W, "prior.log_probs", nan_at),
     ["dels/model.safetensors", "'prior.log_probs' holds 1 NaN/Inf",
      "UnigramPrior.from_counts"], None),
    ("dels prior missing", edit_tensors(DELS_W, lambda t: t.pop("prior.log_probs")),
     ["dels/model.safetensors has no 'prior.log_probs'", "UnigramPrior"], None),
    # DeLS config.json
    ("dels config not JSON", overwrite(DELS_CFG, b"{kind: gru"),
     ["dels/config.json is not valid JSON", "re-export"], None),
    ("dels config wrong type", dels_field(vocab_size="32"),
     ["dels/config.json", "'vocab_size' must be a positive int, got '32'"], None),
    ("dels config out of range", dels_field(rank=0),
     ["dels/config.json", "'rank' must be a positive int, got 0"], None),
    ("dels config NaN weight", dels_field(alpha=math.nan),
     ["dels/config.json", "'alpha' = nan must be finite"], None),
    ("dels config short alpha list", dels_field(alpha=[0.3, 0.3]),
     ["'alpha' has 2 per-slot weights but the drafter proposes 7", ">= 7 entries"], None),
    ("dels for another tokenizer", dels_field(tokenizer_fingerprint="sha256:other"),
     ["tokenizer_fingerprint", "dels", "different tokenizer",
      "train the head and prior with the target's tokenizer"], None),
    ("dels for another vocabulary", dels_field(vocab_size=64),
     ["vocab_size: the DeLS head at", "vocab_size=64", "has 32 logits",
      "use a head trained for this target"], None),
    # dflash_config.liliprop and VLLM_LILIPROP_OPTIONS
    ("liliprop walk wrong type", liliprop(walk=3),
     ["dflash_config.liliprop.walk = 3 is not valid; use one of greedy, viterbi"], None),
    ("liliprop rule unknown", liliprop(rule="lattice+gru"),
     ["dflash_config.liliprop.rule = 'lattice+gru' is not valid"], None),
    ("liliprop unknown field", liliprop(dels_alfa=0.3),
     ["dflash_config.liliprop has unknown field(s) ['dels_alfa']", "known fields"], None),
    ("liliprop dels_alpha wrong type", liliprop(dels_alpha="high"),
     ["dflash_config.liliprop.dels_alpha = 'high' must be a number"], None),
    ("liliprop dels_beta Inf", liliprop(dels_beta=math.inf),
     ["dflash_config.liliprop.dels_beta = inf must be finite"], None),
    ("liliprop dels_alpha too short", liliprop(dels_alpha=[0.3]),
     ["dels_alpha has 1 per-slot weights but the draft proposes 7 tokens"], None),
    ("liliprop dels_path wrong type", liliprop(dels_path=5),
     ["dflash_config.liliprop.dels_path = 5 must be a string path"], None),
    ("liliprop dels_path no head", liliprop(dels_path="nowhere"),
     ["dels_path: no DeLS head at", "nowhere", "export one"], None),
    ("env options not JSON", lambda draft: None,
     [f"{ENV_VAR} is not valid JSON", "set it to an object"], {ENV_VAR: "{walk: viterbi"}),
    ("env options bad value", lambda draft: None,
     [f"{ENV_VAR}.sampling = 'greedy' is not valid; use one of deterministic, probabilistic"],
     {ENV_VAR: '{"sampling": "greedy"}'}),
    # dflash_config.lilicorr_* (checked before vLLM's LiLiCorr model reads them)
    ("lilicorr field missing", head_field("num_heads", drop=True),
     ["dflash_config.lilicorr_num_heads missing", "must set every lilicorr_* field"], None),
    ("lilicorr field wrong type", head_field("candidate_topk", "8"),
     ["dflash_config.lilicorr_candidate_topk = '8' must be a power-of-two int in 1..16",
      "set it to 1, 2, 4, 8 or 16"], None),
    ("lilicorr field out of range", head_field("candidate_topk", 32),
     ["dflash_config.lilicorr_candidate_topk = 32 must be a power-of-two int"], None),
    ("lilicorr field not positive", head_field("logit_scale", -8.0),
     ["dflash_config.lilicorr_logit_scale = -8.0 must be a finite float > 0", "e.g. 8.0"], None),
    ("lilicorr field NaN", head_field("vector_eps", math.nan),
     ["dflash_config.lilicorr_vector_eps = nan must be a finite float > 0"], None),
    ("lilicorr heads vs width", head_field("num_heads", 3),
     ["dflash_config.lilicorr_num_heads = 3 must divide the head width 16"], None),
    ("lilicorr disabled", head_field("enabled", False),
     ["dflash_config.lilicorr_enabled = False", "load it as plain DFlash"], None),
    # lilicorr.* tensors (their names and shapes are checked by vLLM's loader first)
    ("lilicorr tensor NaN", set_tensor("model.safetensors", "lilicorr.in_head.weight", nan_at),
     ["draft (*.safetensors)", "'lilicorr.in_head.weight' holds 1 NaN/Inf",
      "retrain or re-export the draft"], None),
    ("lilicorr tensor wrong dtype",
     set_tensor("model.safetensors", "lilicorr.slot_embedding", lambda w: w.to(torch.int32)),
     ["draft (*.safetensors)", "'lilicorr.slot_embedding' is torch.int32"], None),
]


def test_base_draft_loads(tmp_path):
    assert load(build_draft(tmp_path)).name == "lattice+dels-greedy"


@pytest.mark.parametrize("case, breaker, message, environ", CASES, ids=[c[0] for c in CASES])
def test_bad_checkpoint_is_refused_naming_file_or_field_and_fix(tmp_path, case, breaker,
                                                                 message, environ):
    draft = build_draft(tmp_path)
    breaker(draft)
    with pytest.raises(ValueError) as error:
        load(draft, environ)
    text = str(error.value)
    missing = [part for part in message if part not in text]
    assert not missing, f"{case}: {missing} not in {text!r}"


def test_print_table(tmp_path):
    """The README table: `pytest tests/test_bad_checkpoints.py -s -k print_table`."""
    for index, (case, breaker, _, environ) in enumerate(CASES):
        draft = build_draft(tmp_path / str(index))
        breaker(draft)
        with pytest.raises(ValueError) as error:
            load(draft, environ)
        print(f"| {case} | {str(error.value).replace(str(draft), '<draft>')} |")


def test_load_errors_not_about_weight_shapes_are_left_as_vllm_raised_them(tmp_path):
    from vllm_liliprop.draft_files import explain_load_error

    assert explain_load_error(tmp_path, RuntimeError("CUDA out of memory")) is None
    assert explain_load_error(tmp_path, KeyError("lilicorr_num_heads")) is None
