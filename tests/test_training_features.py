"""Target features: layer taps as vLLM defines them, and the on-disk cache."""

import pytest
import torch

from _training_helpers import patterned_dataset, tiny_recipe, tiny_target
from training.data import collate
from training.features import CachedFeatures, OnlineFeatures, cache_features, target_hidden_states
from training.pipeline import run_draft_training


def test_taps_are_layer_outputs_in_ascending_order_and_final_is_normed():
    model = tiny_target(layers=3)
    batch = collate([patterned_dataset()[i] for i in (0, 1)])
    batch["attention_mask"][1, -5:] = 0  # some right padding
    feats = target_hidden_states(model, batch["input_ids"], batch["attention_mask"], [0, 2])
    with torch.no_grad():
        out = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                          output_hidden_states=True)
    hidden = out.hidden_states  # [embeddings, layer 0, layer 1, normed final]
    # Layer 0's output is HF's hidden_states[1]; layer 2 (the last) is the *un-normed*
    # residual stream in vLLM, which HF only exposes after the final norm.
    torch.testing.assert_close(feats["target_taps"][..., :64], hidden[1])
    torch.testing.assert_close(model.model.norm(feats["target_taps"][..., 64:]), hidden[3])
    torch.testing.assert_close(feats["target_final_hidden"], out.last_hidden_state)
    with pytest.raises(ValueError, match="target_layer_ids"):
        target_hidden_states(model, batch["input_ids"], batch["attention_mask"], [2, 0])


def test_cached_features_equal_online_features_and_train_identically(tmp_path):
    torch.set_num_threads(1)
    model = tiny_target()
    dataset = patterned_dataset()
    written = cache_features(model, dataset, tmp_path / "cache", [0, 2], batch_size=3,
                             dtype=torch.float32, progress=False)
    assert written == len(dataset)
    assert cache_features(model, dataset, tmp_path / "cache", [0, 2], progress=False) == 0  # resumable

    batch = collate([dataset[i] for i in (5, 2)])
    online = OnlineFeatures(model, [0, 2])(batch)
    cached = CachedFeatures(tmp_path / "cache")(batch)
    for key in ("target_taps", "target_final_hidden"):
        torch.testing.assert_close(cached[key], online[key], rtol=1e-5, atol=1e-5)

    recipe = tiny_recipe("lilicorr", tmp_path / "online", max_steps=2)
    a = run_draft_training(recipe, target_model=tiny_target(), dataset=dataset, progress=False)
    recipe = {**tiny_recipe("lilicorr", tmp_path / "cached", max_steps=2),
              "features": {"mode": "cached", "dir": str(tmp_path / "cache")}}
    b = run_draft_training(recipe, target_model=tiny_target(), dataset=dataset, progress=False)
    for x, y in zip(a["history"], b["history"]):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-5)
