"""DeLS short-head training (training/train_dels.py): supervision, learning, prior, export."""

import json

import pytest
import torch
import torch.nn.functional as F

from _training_helpers import single_thread  # noqa: F401 (autouse)
from _training_helpers import patterned_dataset, tiny_target
from training.blocks import sample_anchors
from training.data import collate
from training.drafter import DFlashDrafter, DrafterConfig
from training.export import export_checkpoint, export_dflash
from training.train_dels import ShortHeadObjective, run_dels_training, run_fusion_training
from vllm_liliprop.heads.dels import GRUShortHead, UnigramPrior
from vllm_liliprop.heads.dels_io import load_dels_head


def dels_recipe(kind: str, output_dir, steps: int = 30) -> dict:
    head = {"kind": kind, "hidden_size": 32, "rank": 16} if kind == "gru" else {"kind": kind, "rank": 16}
    return {
        "method": "dels", "device": "cpu", "head": head, "block_size": 4, "num_anchors": 8,
        "train": {"output_dir": str(output_dir), "max_steps": steps, "batch_size": 2, "precision": "fp32",
                  "save_every": 1000, "log_every": 1,
                  "optim": {"lr": {"head": 1e-2}, "weight_decay": {"head": 0.0}}},
    }


@pytest.mark.parametrize("prefix_len", [0, 1])
def test_gru_supervision_matches_the_incremental_serving_protocol(prefix_len):
    """Row s of a block is the head's prediction after consuming, from a zero state, the anchor
    and s true tokens (P = 0), or the block's first s + 1 true tokens without the anchor (P = 1,
    whose slot 0 is never corrected): the same sequence of calls a drafting walk makes."""
    torch.manual_seed(0)
    embed = torch.randn(256, 64)
    head = GRUShortHead(embed, hidden_size=16, rank=8)
    objective = ShortHeadObjective(head, block_size=5, num_anchors=1, pure_draft_prefix_len=prefix_len)
    example = patterned_dataset()[0]
    batch = collate([example])
    terms = objective(batch["input_ids"], batch["loss_mask"], seeds=[7])

    anchors, _ = sample_anchors(batch["loss_mask"], 1, [7])
    a = int(anchors[0, 0])
    tokens = batch["input_ids"][0]
    state = head.init_state(1)
    nll = []
    for s in range(prefix_len, 4):
        logits, state = head.step(tokens[a + s].view(1), state)
        if a + 1 + s < len(tokens) and bool(batch["loss_mask"][0, a + 1 + s]):
            nll.append(F.cross_entropy(logits, tokens[a + 1 + s].view(1)))
    assert len(nll) == 4 - prefix_len  # the sampled block is fully supervised
    assert terms["supervised"].item() == len(nll)
    torch.testing.assert_close(terms["loss"], torch.stack(nll).mean(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["gru", "markov"])
def test_short_head_training_lowers_ce_and_exports_a_loadable_folder(tmp_path, kind):
    dataset = patterned_dataset()
    embed = tiny_target().get_input_embeddings().weight.detach()
    untrained = run_dels_training(dels_recipe(kind, tmp_path / "u", steps=0), embed_weight=embed,
                                  dataset=dataset, progress=False)
    before = untrained["trainer"].evaluate(list(range(len(dataset))))
    result = run_dels_training(dels_recipe(kind, tmp_path / "t"), embed_weight=embed, dataset=dataset,
                               progress=False)
    after = result["trainer"].evaluate(list(range(len(dataset))))
    assert after["ce"] < before["ce"] - 1.0

    # The prior counts loss-masked tokens only, with add-one smoothing.
    counts = torch.zeros(256)
    for example in (dataset[i] for i in range(len(dataset))):
        for token, supervised in zip(example.input_ids, example.loss_mask):
            counts[token] += supervised
    expected = UnigramPrior.from_counts(counts, 1.0).log_probs
    torch.testing.assert_close(result["prior"].log_probs, expected)

    head, prior, config = load_dels_head(result["export_dir"], embed, 256)
    assert config.kind == kind and config.alpha == 0.3 and config.beta == 0.3
    assert config.pure_draft_prefix_len == 0
    torch.testing.assert_close(prior.log_probs, expected)
    trained = result["trainer"].trainable["head"]
    for name, value in trained.state_dict().items():
        torch.testing.assert_close(head.state_dict()[name], value)


@pytest.mark.parametrize("kind", ["gru", "markov"])
def test_a_p1_head_is_exported_for_the_p1_layout_and_its_checkpoint_keeps_it(tmp_path, kind):
    dataset = patterned_dataset()
    embed = tiny_target().get_input_embeddings().weight.detach()
    recipe = {**dels_recipe(kind, tmp_path / "p1", steps=2), "pure_draft_prefix_len": 1}
    recipe["train"]["save_every"] = 1
    result = run_dels_training(recipe, embed_weight=embed, dataset=dataset, progress=False)
    assert load_dels_head(result["export_dir"], embed, 256)[2].pure_draft_prefix_len == 1
    checkpoint = sorted((tmp_path / "p1" / "checkpoints").glob("step_*"))[-1]
    exported = export_checkpoint(checkpoint, tmp_path / "from_checkpoint")
    assert load_dels_head(exported, embed, 256)[2].pure_draft_prefix_len == 1


def test_a_p1_objective_needs_a_block_of_three():
    head = GRUShortHead(torch.randn(256, 64), hidden_size=16, rank=8)
    with pytest.raises(ValueError, match="block_size must be >= 3"):
        ShortHeadObjective(head, block_size=2, pure_draft_prefix_len=1)
    with pytest.raises(ValueError, match="pure_draft_prefix_len"):
        ShortHeadObjective(head, block_size=8, pure_draft_prefix_len=2)


def test_learnable_alpha_beta_fit_with_everything_else_frozen(tmp_path):
    target = tiny_target()
    dataset = patterned_dataset()
    embed = target.get_input_embeddings().weight.detach()
    heads = run_dels_training(dels_recipe("gru", tmp_path / "head", steps=20), embed_weight=embed,
                              dataset=dataset, progress=False)
    torch.manual_seed(0)
    drafter = DFlashDrafter(DrafterConfig(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, target_layer_ids=[0, 2], mask_token_id=255, block_size=4,
        rope_theta=10000.0))
    export_dflash(tmp_path / "drafter", drafter)
    frozen_head = {k: v.clone() for k, v in heads["trainer"].trainable["head"].state_dict().items()}

    recipe = {
        "method": "dels_fusion", "device": "cpu", "target_dtype": "float32",
        "drafter": str(tmp_path / "drafter"), "dels": str(heads["export_dir"]), "num_anchors": 8,
        "train": {"output_dir": str(tmp_path / "fusion"), "max_steps": 15, "batch_size": 2,
                  "precision": "fp32", "save_every": 1000,
                  "optim": {"lr": {"head": 5e-2}, "weight_decay": {"head": 0.0}, "warmup_ratio": 0.0}},
    }
    result = run_fusion_training(recipe, target_model=target, dataset=dataset, progress=False)
    history = result["history"]
    assert history[-1]["ce"] < history[0]["ce"]
    assert len(result["alpha"]) == 3 and len(result["beta"]) == 3
    assert result["alpha"] != [0.3] * 3
    config = json.loads((result["export_dir"] / "config.json").read_text())
    assert config["alpha"] == result["alpha"] and config["beta"] == result["beta"]
    # The short head itself did not move.
    head, _, _ = load_dels_head(result["export_dir"], embed, 256)
    for name, value in frozen_head.items():
        torch.testing.assert_close(head.state_dict()[name], value)
