"""Joint DFlash + LiLiCorr training: gradient paths, learning, exports, exact resume, DDP."""

import json
import socket

import pytest
import torch

import training.objective as objective_module
from _training_helpers import single_thread  # noqa: F401 (autouse)
from _training_helpers import (
    MASK_TOKEN,
    ddp_worker,
    patterned_dataset,
    tiny_recipe,
    tiny_target,
)
from training.data import collate
from training.export import load_dflash, load_lilicorr
from training.features import OnlineFeatures, frozen_target_weights
from training.losses import LossWeights
from training.objective import DraftObjective
from training.pipeline import build_drafter, build_lattice, run_draft_training


def joint_objective(weights=LossWeights(dflash_decay=4.0, distractor=0.0)):
    target = tiny_target()
    recipe = tiny_recipe("lilicorr", "unused")
    torch.manual_seed(0)
    drafter = build_drafter(recipe["drafter"], target.config)
    lattice = build_lattice(recipe["lattice"], drafter.config)
    embed, head = frozen_target_weights(target)
    objective = DraftObjective(drafter, embed, head, lattice=lattice, weights=weights, num_anchors=8)
    batch = collate([patterned_dataset()[i] for i in (0, 1)])
    feats = OnlineFeatures(target, drafter.config.target_layer_ids)(batch)
    inputs = dict(input_ids=batch["input_ids"], loss_mask=batch["loss_mask"],
                  target_taps=feats["target_taps"], seeds=[3, 4],
                  target_final_hidden=feats["target_final_hidden"])
    # Overfit the drafter on this batch first so that ground truths enter the top-K (an
    # untrained drafter covers none, and the reranker terms would then be zero).
    optimizer = torch.optim.Adam(drafter.parameters(), lr=1e-2)
    for _ in range(15):
        optimizer.zero_grad()
        objective(**inputs)["dflash"].backward()
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    for param in objective.parameters():
        param.grad = None
    return objective, inputs


def test_reranker_gradient_reaches_drafter_through_log_probs_and_hidden_states(monkeypatch):
    objective, inputs = joint_objective()
    captured = {}
    real_topk = objective_module.topk_candidates

    def checked_topk(logits, k):
        captured["selection_input_requires_grad"] = logits.requires_grad
        return real_topk(logits, k)

    real_score = objective.lattice.score

    def capturing_score(token_embeddings, log_probs, pass_hidden, anchor_hidden, anchor_valid):
        for name, t in (("log_probs", log_probs), ("pass_hidden", pass_hidden), ("anchor_hidden", anchor_hidden)):
            t.retain_grad()
            captured[name] = t
        captured["token_embeddings"] = token_embeddings
        return real_score(token_embeddings, log_probs, pass_hidden, anchor_hidden, anchor_valid)

    monkeypatch.setattr(objective_module, "topk_candidates", checked_topk)
    monkeypatch.setattr(objective.lattice, "score", capturing_score)
    terms = objective(**inputs)
    assert terms["oracle_slots"] > 0
    terms["ce"].backward()  # the reranker term alone, no DFlash CE

    assert captured["selection_input_requires_grad"] is False  # top-K chosen without gradient
    assert not captured["token_embeddings"].requires_grad  # frozen target embeddings
    for name in ("log_probs", "pass_hidden", "anchor_hidden"):
        assert captured[name].grad is not None and captured[name].grad.abs().sum() > 0, name
    drafter = objective.drafter
    assert drafter.layers[0].mlp.down_proj.weight.grad.abs().sum() > 0  # via slot states
    assert drafter.fc.weight.grad.abs().sum() > 0  # via context and anchor state
    assert objective.embed_weight.grad is None and objective.lm_head_weight.grad is None


def test_log_prob_path_alone_carries_gradient_to_drafter(monkeypatch):
    """Cut the hidden-state paths: the CE must still move the drafter via candidate log-probs."""
    objective, inputs = joint_objective()
    real_score = objective.lattice.score

    def log_prob_path_only(token_embeddings, log_probs, pass_hidden, anchor_hidden, anchor_valid):
        return real_score(token_embeddings, log_probs, pass_hidden.detach(), anchor_hidden.detach(), anchor_valid)

    monkeypatch.setattr(objective.lattice, "score", log_prob_path_only)
    objective(**inputs)["ce"].backward()
    assert objective.drafter.layers[0].mlp.down_proj.weight.grad.abs().sum() > 0


def test_short_run_drives_every_loss_down_and_exports(tmp_path):
    dataset = patterned_dataset()
    everything = list(range(len(dataset)))

    # Stage 1: DFlash alone.
    dflash = tiny_recipe("dflash", tmp_path / "dflash", max_steps=20, save_every=100)
    dflash["train"]["optim"]["lr"] = {"drafter": 1e-2, "head": 1e-2}
    untrained = run_draft_training({**dflash, "train": {**dflash["train"], "max_steps": 0,
                                                        "output_dir": str(tmp_path / "d0")}},
                                   target_model=tiny_target(), dataset=dataset, progress=False)
    before = untrained["trainer"].evaluate(everything)
    result = run_draft_training(dflash, target_model=tiny_target(), dataset=dataset, progress=False)
    after = result["trainer"].evaluate(everything)
    assert after["dflash"] < 0.5 * before["dflash"]
    assert after["accept_argmax"] > before["accept_argmax"]

    export = result["export_dir"]
    config = json.loads((export / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["dflash_config"] == {"mask_token_id": MASK_TOKEN, "target_layer_ids": [0, 2], "block_size": 4}
    drafter = result["trainer"].trainable["drafter"]
    reloaded = load_dflash(export)
    for name, value in drafter.state_dict().items():
        torch.testing.assert_close(reloaded.state_dict()[name], value.to(torch.bfloat16).float())

    # Stage 2: joint LiLiCorr from the DFlash export, margin variant (every term active).
    joint = tiny_recipe("lilicorr", tmp_path / "joint", max_steps=20, save_every=100)
    joint["drafter"] = {"init_from": str(export)}
    joint["loss"] = {"dflash_decay": 4.0, "margin_blend": 0.5}
    joint["train"]["optim"]["lr"] = {"drafter": 1e-3, "head": 3e-3}
    start = run_draft_training({**joint, "train": {**joint["train"], "max_steps": 0,
                                                   "output_dir": str(tmp_path / "j0")}},
                               target_model=tiny_target(), dataset=dataset, progress=False)
    before = start["trainer"].evaluate(everything)
    result = run_draft_training(joint, target_model=tiny_target(), dataset=dataset, progress=False)
    after = result["trainer"].evaluate(everything)
    for term in ("dflash", "ce", "distractor", "margin"):
        assert after[term] < before[term], (term, before[term], after[term])
    assert after["accept_walk"] > before["accept_walk"]

    export = result["export_dir"]
    config = json.loads((export / "config.json").read_text())
    assert config["architectures"] == ["LiLiCorrDraftModel"] and config["model_type"] == "qwen3"
    dflash_config = config["dflash_config"]
    assert dflash_config["lilicorr_enabled"] is True and dflash_config["lilicorr_candidate_topk"] == 4
    assert dflash_config["block_size"] == 4 and dflash_config["mask_token_id"] == MASK_TOKEN
    drafter2, lattice2 = load_lilicorr(export)
    lattice = result["trainer"].trainable["head"]
    for name, value in lattice.state_dict().items():
        torch.testing.assert_close(lattice2.state_dict()[name], value.to(torch.bfloat16).float())


def test_resume_reproduces_the_uninterrupted_run_exactly(tmp_path):
    dataset = patterned_dataset()
    full = tiny_recipe("lilicorr", tmp_path / "full", max_steps=6, save_every=3)
    full["loss"] = {"dflash_decay": 4.0, "margin_blend": 0.5}
    straight = run_draft_training(full, target_model=tiny_target(), dataset=dataset, progress=False)

    # A second run in a fresh directory, seeded differently before resuming: everything that
    # matters must come from the checkpoint.
    torch.manual_seed(1234)
    resumed_recipe = {**full, "train": {**full["train"], "output_dir": str(tmp_path / "resumed")}}
    checkpoint = tmp_path / "full" / "checkpoints" / "step_00000003"
    resumed = run_draft_training(resumed_recipe, resume=str(checkpoint), target_model=tiny_target(),
                                 dataset=dataset, progress=False)
    assert [h["step"] for h in resumed["history"]] == [4, 5, 6]
    for a, b in zip(straight["history"][3:], resumed["history"]):
        for key in ("loss", "dflash", "ce", "distractor", "margin", "grad_norm", "lr/drafter"):
            assert a[key] == b[key], (key, a[key], b[key])
    for name, module in straight["trainer"].trainable.items():
        for key, value in module.state_dict().items():
            assert torch.equal(value, resumed["trainer"].trainable[name].state_dict()[key]), key


def test_resume_with_a_different_global_batch_is_refused(tmp_path):
    recipe = tiny_recipe("dflash", tmp_path / "a", max_steps=1, save_every=1)
    run_draft_training(recipe, target_model=tiny_target(), dataset=patterned_dataset(), progress=False)
    other = tiny_recipe("dflash", tmp_path / "b", max_steps=2, batch_size=4)
    with pytest.raises(ValueError, match="global batch"):
        run_draft_training(other, resume=str(tmp_path / "a" / "checkpoints" / "step_00000001"),
                           target_model=tiny_target(), dataset=patterned_dataset(), progress=False)


@pytest.mark.slow
def test_two_process_gloo_ddp_matches_single_process(tmp_path):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    recipe = tiny_recipe("lilicorr", tmp_path / "ddp", max_steps=2, batch_size=1, save_every=100)
    recipe["loss"] = {"dflash_decay": 4.0, "margin_blend": 0.5}
    mp.spawn(ddp_worker, args=(2, port, recipe, str(tmp_path)), nprocs=2, join=True)

    single = tiny_recipe("lilicorr", tmp_path / "single", max_steps=2, batch_size=2, save_every=100)
    single["loss"] = recipe["loss"]
    result = run_draft_training(single, target_model=tiny_target(), dataset=patterned_dataset(), progress=False)

    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for step, logs in enumerate(result["history"]):
        for rank in ranks:  # the clipped norm is of the all-reduced (global) gradient
            assert rank["history"][step]["grad_norm"] == pytest.approx(logs["grad_norm"], rel=1e-4)
    for name, module in result["trainer"].trainable.items():
        for key, value in module.state_dict().items():
            for rank in ranks:
                torch.testing.assert_close(torch.tensor(rank["state"][name][key]), value, rtol=1e-4, atol=1e-5)


def test_bf16_autocast_with_a_bf16_target_trains(tmp_path):
    recipe = tiny_recipe("lilicorr", tmp_path / "bf16", max_steps=3, precision="bf16")
    recipe["loss"] = {"dflash_decay": 4.0, "margin_blend": 0.5}
    result = run_draft_training(recipe, target_model=tiny_target().to(torch.bfloat16),
                                dataset=patterned_dataset(), progress=False)
    losses = [h["loss"] for h in result["history"]]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    # Master weights stay fp32 under autocast.
    assert result["trainer"].trainable["drafter"].fc.weight.dtype == torch.float32


def test_export_vocab_train_writes_upstream_reduced_vocabulary(tmp_path):
    """export_vocab = "train": the DFlash export carries draft_vocab_size, lm_head rows and d2t
    of the train_vocab ids; the backbone still reloads; LiLiCorr refuses (upstream needs the
    full vocabulary); and out-of-order ids cannot be exported."""
    from training.data import training_vocabulary
    from training.export import draft_vocab_tensors, read_draft_vocab

    dataset, target = patterned_dataset(), tiny_target()
    recipe = tiny_recipe("dflash", tmp_path / "run", max_steps=2, save_every=100)
    recipe.update(train_vocab={"size": 12}, export_vocab="train")
    result = run_draft_training(recipe, target_model=target, dataset=dataset, progress=False)
    export = result["export_dir"]
    ids, _ = training_vocabulary(dataset, target.config.vocab_size, 12)
    assert json.loads((export / "config.json").read_text())["draft_vocab_size"] == 12
    assert torch.equal(read_draft_vocab(export), ids)
    load_dflash(export)  # lm_head and d2t are not backbone weights
    _, lm_head = frozen_target_weights(target)
    from safetensors.torch import load_file

    torch.testing.assert_close(load_file(str(export / "model.safetensors"))["lm_head.weight"].float(),
                               lm_head[ids].to(torch.bfloat16).float())
    with pytest.raises(ValueError, match="export_vocab"):
        run_draft_training({**tiny_recipe("lilicorr", tmp_path / "j"), "train_vocab": {"size": 12},
                            "export_vocab": "train"}, target_model=target, dataset=dataset, progress=False)
    with pytest.raises(ValueError, match="train_vocab"):
        run_draft_training({**tiny_recipe("dflash", tmp_path / "k"), "export_vocab": "train"},
                           target_model=target, dataset=dataset, progress=False)
    with pytest.raises(ValueError, match="strictly increasing"):
        draft_vocab_tensors(torch.tensor([3, 1, 2]), lm_head)


def test_a_loaded_drafter_takes_the_recipes_block_size_and_refuses_other_changes(tmp_path):
    """Block 8 -> 16 continues a drafter (its weights do not depend on the block); a recipe
    field that would change the weights' shapes is an error, not silently ignored."""
    target = tiny_target()
    recipe = tiny_recipe("dflash", tmp_path / "d", max_steps=0)
    exported = run_draft_training(recipe, target_model=target, dataset=patterned_dataset(), progress=False)
    source = exported["export_dir"]

    wider = build_drafter({**recipe["drafter"], "block_size": 8, "init_from": str(source)}, target.config)
    assert wider.config.block_size == 8
    original = load_dflash(source)
    assert original.config.block_size == 4
    for name, value in original.state_dict().items():
        torch.testing.assert_close(wider.state_dict()[name], value)
    assert build_lattice(tiny_recipe("lilicorr", "unused")["lattice"], wider.config).config.block_size == 8

    with pytest.raises(ValueError, match=r"drafter\.num_hidden_layers = 2.*remove drafter\.num_hidden_layers"):
        build_drafter({**recipe["drafter"], "num_hidden_layers": 2, "init_from": str(source)}, target.config)
    with pytest.raises(ValueError, match=r"drafter\.target_layer_ids"):
        build_drafter({"target_layer_ids": [0, 1], "init_from": str(source)}, target.config)
    with pytest.raises(ValueError, match=r"unknown recipe drafter fields \['blocksize'\]"):
        build_drafter({"blocksize": 8, "init_from": str(source)}, target.config)
