"""The testbed's target through the shared Trainer (training.lm), its recipe mapping, and the
testbed's rerun rules."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests._training_helpers import patterned_dataset, tiny_target
from training.build_stages.target import target_train_config
from training.lm import NextTokenObjective, pad_sequences, run_lm_training
from training.trainer import Trainer, cosine_with_warmup

SPEC = {"steps": 250, "batch_size": 8, "seq_len": 128, "lr": 0.003, "warmup_steps": 25, "weight_decay": 0.01}


def _previous_schedule(steps: int, warmup: int):
    """The multiplier of the testbed's former hand-written loop: linear warmup, cosine to 0.1."""
    return lambda s: min(1.0, (s + 1) / max(1, warmup)) * (
        0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, max(0, s - warmup) / max(1, steps - warmup)))))


@pytest.mark.parametrize("steps,warmup", [(250, 25), (1300, 60), (10, 0)])
def test_warmup_steps_give_the_former_schedule(steps, warmup):
    ours = cosine_with_warmup(steps, 0.0, 0.1, warmup_steps=warmup)
    before = _previous_schedule(steps, warmup)
    for s in range(steps):
        assert ours(s) == pytest.approx(before(s), abs=1e-12)


def test_target_train_fields_map_onto_the_trainer_config(tmp_path):
    config = target_train_config(SPEC, tmp_path, seed=3)
    assert (config.max_steps, config.batch_size, config.grad_accum, config.seed) == (250, 8, 1, 3)
    assert config.optim.lr == {"model": 0.003} and config.optim.weight_decay == {"model": 0.01}
    assert (config.optim.warmup_steps, config.optim.min_lr_ratio, config.optim.betas) == (25, 0.1, (0.9, 0.95))
    assert config.precision == "fp32" and config.output_dir == str(tmp_path)


def test_next_token_objective_is_the_token_mean_ce():
    model = tiny_target()
    sequences = [[1, 2, 3, 4, 5], [6, 7, 8]]
    ids, labels = pad_sequences(sequences, pad_id=0)
    assert labels.tolist()[1] == [6, 7, 8, -100, -100]
    terms = NextTokenObjective(model)(ids, labels)
    expected = torch.cat([
        torch.nn.functional.cross_entropy(model(input_ids=torch.tensor([s])).logits[0, :-1].float(),
                                          torch.tensor(s[1:]), reduction="none") for s in sequences])
    assert float(terms["tokens"]) == 6
    torch.testing.assert_close(terms["loss"], expected.mean(), rtol=1e-4, atol=1e-5)


def _sequences():
    return [list(ids) for ids in patterned_dataset(num=8, length=24).input_ids]


def test_lm_training_learns_and_resumes_exactly(tmp_path):
    spec = {**SPEC, "steps": 6, "batch_size": 2, "warmup_steps": 1, "lr": 0.01}
    sequences = _sequences()
    whole = tiny_target()
    result = run_lm_training(whole, sequences, 0, target_train_config(spec, tmp_path / "whole", 0))
    history = result["history"]
    assert [h["step"] for h in history] == list(range(1, 7)) and history[-1]["loss"] < history[0]["loss"]
    assert not whole.training

    # The same 6-step run stopped after 3 steps, then resumed from that checkpoint by a new model.
    config = target_train_config(spec, tmp_path / "split", 0)
    model = tiny_target()

    def make_inputs(indices, epoch):
        ids, labels = pad_sequences([sequences[i] for i in indices], 0)
        return {"input_ids": ids, "labels": labels}

    interrupted = Trainer(NextTokenObjective(model), {"model": model}, make_inputs, len(sequences), config,
                          progress=False)
    for _ in range(3):
        interrupted.train_step()
    interrupted.save_checkpoint()
    resumed = tiny_target(seed=1)  # other weights: everything comes from the checkpoint
    trainer = run_lm_training(resumed, sequences, 0, config)["trainer"]
    assert trainer.step == 6
    for a, b in zip(whole.state_dict().values(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b)


def test_trainer_accepts_the_objective_like_a_drafter_objective(tmp_path):
    model = tiny_target()
    objective = NextTokenObjective(model)
    sequences = _sequences()

    def make_inputs(indices, epoch):
        ids, labels = pad_sequences([sequences[i] for i in indices], 0)
        return {"input_ids": ids, "labels": labels}

    trainer = Trainer(objective, {"model": model}, make_inputs, len(sequences),
                      target_train_config({**SPEC, "steps": 2, "batch_size": 4}, tmp_path, 0), progress=False)
    logs = trainer.train_step()
    assert {"loss", "tokens", "grad_norm", "lr/model"} <= set(logs)


def test_a_finished_testbed_is_left_as_it_is_and_another_recipe_is_refused(tmp_path):
    from training.recipe import load_recipe
    from training.testbed import PRESET_DIR, run_testbed

    recipe = load_recipe(PRESET_DIR / "smoke.json")
    other = {**recipe, "seed": 1}
    finished = {"recipe": recipe, "metrics": {"done": 1}}
    (tmp_path / "manifest.json").write_text(json.dumps(finished))
    assert run_testbed(recipe, tmp_path, log=lambda _: None) == finished
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]  # nothing written
    with pytest.raises(ValueError, match="another recipe"):
        run_testbed(other, tmp_path, log=lambda _: None)
    # A started folder keeps its recipe and refuses another one before running any stage.
    started = tmp_path / "started"
    started.mkdir()
    (started / "recipe.json").write_text(json.dumps(recipe))
    with pytest.raises(ValueError, match="another recipe"):
        run_testbed(other, started, log=lambda _: None)
    assert not (started / "stages").exists()
