"""Bad drafter weight files, which vLLM's own loader reads, in real engines: the engine must stop
at start, never serve, with a message that names the file or the tensor (vllm_liliprop/
draft_files.py; recorded in docs/serving.md, "Bad checkpoints"), where vLLM's own names neither.

The plugin's own load path (options, LiLiCorr head fields and values, DeLS heads) is covered
without engines in tests/test_bad_checkpoints.py.
"""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.engine import error_chain, generate
from vllm_liliprop.fixtures import build_tiny_lilicorr_draft

pytestmark = pytest.mark.vllm


def refused_at_start(tiny_models, draft) -> str:
    with pytest.raises(Exception) as error:
        generate(tiny_models["target"], draft, max_tokens=4, prompts=["x"])
    return error_chain(error.value)


def test_truncated_draft_weights_stop_the_engine(tiny_models):
    draft = build_tiny_lilicorr_draft(tiny_models["root"] / "bad-truncated", tiny_models["target"])
    weights = draft / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    text = refused_at_start(tiny_models, draft)
    print(text)
    assert f"{weights} cannot be read as safetensors (Error while deserializing header" in text, text
    assert "re-export the draft" in text, text


def test_wrong_shape_lattice_tensor_stops_the_engine(tiny_models):
    draft = build_tiny_lilicorr_draft(tiny_models["root"] / "bad-shape", tiny_models["target"])
    weights = load_file(str(draft / "model.safetensors"))
    name = "lilicorr.in_head.weight"
    weights[name] = torch.zeros(weights[name].shape[0] + 1, weights[name].shape[1])
    save_file(weights, str(draft / "model.safetensors"))
    text = refused_at_start(tiny_models, draft)
    print(text)
    assert (f"{draft}: a checkpoint tensor of shape (33, 128) (lilicorr.in_head.weight) is "
            "loaded into a parameter of shape (32, 128)") in text, text
    assert "Tried to load weights of size torch.Size([33, 128])" in text, text  # vLLM's, chained


def test_index_naming_a_missing_weight_file_stops_the_engine(tiny_models):
    draft = build_tiny_lilicorr_draft(tiny_models["root"] / "bad-index", tiny_models["target"])
    weights = load_file(str(draft / "model.safetensors"))
    (draft / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {name: "model-00002-of-00002.safetensors" for name in weights}}))
    text = refused_at_start(tiny_models, draft)
    print(text)
    assert (f"{draft / 'model.safetensors.index.json'} names ['model-00002-of-00002.safetensors'], "
            "which is missing") in text, text
