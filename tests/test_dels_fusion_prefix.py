"""Learned DeLS alpha/beta (training.train_dels.FusionObjective) in the head's serving layout.

P = pure_draft_prefix_len of the DeLS folder. P = 1 (DeLS-Spec's layout, the shipped SmolLM2
heads): slot 0 is the drafter's alone (alpha_0 = beta_0 = 0, never trained) and slot s >= 1 fuses
the head's prediction after x_{a+1} .. x_{a+s}, what serving feeds it along an accepted prefix.
P = 0 is pinned to the loss it had before P was honoured. A drafter with a reduced vocabulary is
scored over its ids, as the serving rule does.
"""

import json

import pytest
import torch
import torch.nn.functional as F

import training.train_dels as train_dels
from _training_helpers import single_thread  # noqa: F401 (autouse)
from _training_helpers import patterned_dataset, record_realbed_stages, tiny_target
from training.blocks import sample_anchors
from training.data import collate
from training.drafter import DFlashDrafter, DrafterConfig
from training.export import export_dels, export_dflash
from training.features import OnlineFeatures
from training.train_dels import FusionObjective, run_fusion_training
from vllm_liliprop.heads.dels import GRUShortHead, MarkovShortHead, UnigramPrior, slot_schedule
from vllm_liliprop.heads.dels_io import load_dels_head

BLOCK = 5  # S = 4 draft slots
SEEDS = [3, 4, 5]


def _drafter(block_size: int = BLOCK) -> DFlashDrafter:
    torch.manual_seed(0)
    return DFlashDrafter(DrafterConfig(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, target_layer_ids=[0, 2], mask_token_id=255, block_size=block_size,
        rope_theta=10000.0))


def _setup(kind: str):
    target = tiny_target()
    embed = target.get_input_embeddings().weight.detach()
    lm_head = target.get_output_embeddings().weight.detach()
    drafter = _drafter()
    head = GRUShortHead(embed, hidden_size=16, rank=8) if kind == "gru" else MarkovShortHead(256, 8)
    prior = UnigramPrior.from_counts(torch.arange(256, dtype=torch.float64) % 7, 1.0)
    dataset = patterned_dataset()
    batch = collate([dataset[i] for i in range(3)])
    taps = OnlineFeatures(target, [0, 2], final_hidden=False)(batch)["target_taps"]
    return drafter, head, prior, embed, lm_head, batch, taps


def _set_schedules(objective: FusionObjective) -> None:
    with torch.no_grad():
        objective.alpha.copy_(torch.tensor([0.1, 0.7, 0.4, 0.9]))
        objective.beta.copy_(torch.tensor([0.3, 0.05, 0.6, 0.2]))


def _recorded(monkeypatch, objective, batch, taps):
    """Run the objective, recording what it hands to the CE (fused, then long-only logits) and
    to dels_fuse (the short logits)."""
    ce_inputs, short = [], []
    sum_ce, fuse = train_dels._sum_ce, train_dels.dels_fuse

    def recording_sum_ce(logits, labels, mask):
        ce_inputs.append((logits.detach().clone(), labels.clone(), mask.bool()))
        return sum_ce(logits, labels, mask)

    def recording_fuse(long_logits, short_logits, *args):
        short.append(short_logits.detach().clone())
        return fuse(long_logits, short_logits, *args)

    monkeypatch.setattr(train_dels, "_sum_ce", recording_sum_ce)
    monkeypatch.setattr(train_dels, "dels_fuse", recording_fuse)
    terms = objective(batch["input_ids"], batch["loss_mask"], taps, seeds=SEEDS)
    (fused, labels, mask), (long_logits, _, _) = ce_inputs
    return terms, fused, labels, mask, long_logits, short[0]


def _valid_anchors(batch) -> list[tuple[int, int]]:
    """(example, anchor position) of every valid block, in the objective's row order."""
    anchors, valid = sample_anchors(batch["loss_mask"].bool(), 6, SEEDS)
    return [(b, int(anchors[b, n])) for b in range(anchors.shape[0]) for n in range(anchors.shape[1])
            if bool(valid[b, n])]


# The FusionObjective loss of a P = 0 head on this fixed setup, computed before the head's
# layout was honoured (the short head then always read the anchor first): P = 0 must not move.
PINNED_P0 = {"gru": 10.604893684387207, "markov": 10.644766807556152}
PINNED_LONG_ONLY = 10.332737922668457


@pytest.mark.parametrize("kind", ["gru", "markov"])
def test_p0_loss_is_unchanged(kind):
    drafter, head, prior, embed, lm_head, batch, taps = _setup(kind)
    objective = FusionObjective(drafter, head, prior, embed, lm_head, num_anchors=6, alpha=0.5, beta=0.2)
    _set_schedules(objective)
    terms = objective(batch["input_ids"], batch["loss_mask"], taps, seeds=SEEDS)
    assert terms["supervised"].item() == 68
    assert terms["loss"].item() == pytest.approx(PINNED_P0[kind], rel=1e-6)
    assert terms["long_only_ce"].item() == pytest.approx(PINNED_LONG_ONLY, rel=1e-6)


@pytest.mark.parametrize("kind", ["gru", "markov"])
def test_p0_short_logits_read_the_anchor_first(monkeypatch, kind):
    drafter, head, prior, embed, lm_head, batch, taps = _setup(kind)
    objective = FusionObjective(drafter, head, prior, embed, lm_head, num_anchors=6)
    _, _, _, _, _, short = _recorded(monkeypatch, objective, batch, taps)
    tokens = batch["input_ids"]
    for row, (b, a) in enumerate(_valid_anchors(batch)):
        state = head.init_state(1)
        for s in range(BLOCK - 1):  # slot s after x_a .. x_{a+s}
            if a + s >= tokens.shape[1]:
                break  # past the sequence's end: a masked slot
            logits, state = head.step(tokens[b, a + s].view(1), state)
            torch.testing.assert_close(short[row, s], logits[0].float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["gru", "markov"])
def test_p1_slot0_is_the_drafter_alone_and_later_slots_read_the_block_prefix(monkeypatch, kind):
    drafter, head, prior, embed, lm_head, batch, taps = _setup(kind)
    objective = FusionObjective(drafter, head, prior, embed, lm_head, num_anchors=6, pure_draft_prefix_len=1)
    # Slot 0 starts (and stays) at 0, what serving applies there.
    assert objective.alpha[0].item() == 0.0 and objective.beta[0].item() == 0.0
    assert objective.alpha[1:].tolist() == [pytest.approx(0.3)] * 3
    _set_schedules(objective)
    terms, fused, labels, mask, long_logits, short = _recorded(monkeypatch, objective, batch, taps)
    rows = _valid_anchors(batch)
    assert fused.shape == long_logits.shape == (len(rows), BLOCK - 1, 256)
    assert short.shape == (len(rows), BLOCK - 2, 256)

    # Slot 0: the long logits, exactly (alpha_0 = 0.1, beta_0 = 0.3 set above play no part).
    torch.testing.assert_close(fused[:, 0], long_logits[:, 0], rtol=0, atol=0)
    assert not torch.allclose(fused[:, 1:], long_logits[:, 1:])

    # Slot s >= 1: the head run by hand on x_{a+1} .. x_{a+s}, from a zero state (no anchor),
    # fused with alpha[s], beta[s].
    tokens = batch["input_ids"]
    for row, (b, a) in enumerate(rows):
        state = head.init_state(1)
        for s in range(1, BLOCK - 1):
            if a + s >= tokens.shape[1]:
                break  # past the sequence's end: a masked slot
            logits, state = head.step(tokens[b, a + s].view(1), state)
            torch.testing.assert_close(short[row, s - 1], logits[0].float(), rtol=1e-5, atol=1e-5)
            expected = (long_logits[row, s] + objective.alpha[s].item() * torch.log_softmax(logits[0].float(), -1)
                        - objective.beta[s].item() * prior.log_probs)
            torch.testing.assert_close(fused[row, s], expected, rtol=1e-5, atol=1e-5)

    # Every slot is supervised (slot 0 with the long logits' CE), as in the P = 0 objective.
    assert terms["supervised"].item() == 68 and int(mask.sum()) == 68
    expected_loss = F.cross_entropy(fused.flatten(0, 1), labels.clamp(min=0).flatten(), reduction="none")
    torch.testing.assert_close(terms["loss"], (expected_loss * mask.flatten()).sum() / mask.sum())

    # Slot 0's alpha/beta get no gradient; the fused slots' do.
    terms["loss"].backward()
    assert objective.alpha.grad[0].item() == 0.0 and objective.beta.grad[0].item() == 0.0
    assert bool((objective.alpha.grad[1:] != 0).all()) and bool((objective.beta.grad[1:] != 0).all())


def test_p1_needs_a_fused_slot_and_p_is_checked():
    drafter, head, prior, embed, lm_head, _, _ = _setup("markov")
    with pytest.raises(ValueError, match="block_size must be >= 3"):
        FusionObjective(_drafter(block_size=2), head, prior, embed, lm_head, pure_draft_prefix_len=1)
    with pytest.raises(ValueError, match="pure_draft_prefix_len"):
        FusionObjective(drafter, head, prior, embed, lm_head, pure_draft_prefix_len=2)


def test_a_reduced_draft_vocabulary_is_scored_over_its_ids(monkeypatch):
    drafter, head, prior, embed, lm_head, batch, taps = _setup("gru")
    full = FusionObjective(drafter, head, prior, embed, lm_head, num_anchors=6, pure_draft_prefix_len=1)
    _, _, full_labels, full_mask, full_long, full_short = _recorded(monkeypatch, full, batch, taps)
    monkeypatch.undo()
    # The motif tokens 0..15 are the supervised ones; drop a few of them from the draft vocabulary.
    ids = torch.tensor([i for i in range(256) if i not in (1, 5, 9)])
    restricted = FusionObjective(drafter, head, prior, embed, lm_head, num_anchors=6, pure_draft_prefix_len=1,
                                 vocab_ids=ids)
    terms, fused, labels, mask, long_logits, short = _recorded(monkeypatch, restricted, batch, taps)
    torch.testing.assert_close(long_logits, full_long[..., ids])
    torch.testing.assert_close(short, full_short[..., ids])
    torch.testing.assert_close(fused[:, 0], long_logits[:, 0], rtol=0, atol=0)
    alpha, beta = restricted.alpha[1].item(), restricted.beta[1].item()
    expected = long_logits[:, 1] + alpha * torch.log_softmax(short[:, 0], -1) - beta * prior.log_probs[ids]
    torch.testing.assert_close(fused[:, 1], expected)
    # Labels are draft-vocabulary indices; a label the draft cannot propose is not supervised.
    dropped = full_mask & torch.isin(full_labels, torch.tensor([1, 5, 9]))
    assert int(dropped.sum()) > 0
    assert torch.equal(mask, full_mask & ~dropped)
    assert torch.equal(ids[labels[mask]], full_labels[mask])
    assert terms["supervised"].item() == int(full_mask.sum() - dropped.sum())


def test_run_fusion_training_exports_a_p1_schedule_serving_reads(tmp_path):
    """The recipe names a P = 1 folder and a drafter with a reduced vocabulary: the export has S
    entries per schedule, entry s for slot s, slot 0's at 0, and keeps the head's layout."""
    target = tiny_target()
    dataset = patterned_dataset()
    embed = target.get_input_embeddings().weight.detach()
    drafter = _drafter()
    ids = torch.arange(200)
    export_dflash(tmp_path / "drafter", drafter, draft_vocab=(ids, target.get_output_embeddings().weight.detach()))
    torch.manual_seed(1)
    head = MarkovShortHead(256, 8)
    prior = UnigramPrior.from_counts(torch.ones(256), 1.0)
    export_dels(tmp_path / "dels", head, prior, alpha=0.3, beta=0.3, pure_draft_prefix_len=1)
    recipe = {
        "method": "dels_fusion", "device": "cpu", "target_dtype": "float32",
        "drafter": str(tmp_path / "drafter"), "dels": str(tmp_path / "dels"), "num_anchors": 8,
        "train": {"output_dir": str(tmp_path / "fusion"), "max_steps": 4, "batch_size": 2,
                  "precision": "fp32", "save_every": 1000,
                  "optim": {"lr": {"head": 5e-2}, "weight_decay": {"head": 0.1}, "warmup_ratio": 0.0}},
    }
    result = run_fusion_training(recipe, target_model=target, dataset=dataset, progress=False)
    assert len(result["alpha"]) == len(result["beta"]) == BLOCK - 1
    assert result["alpha"][0] == 0.0 and result["beta"][0] == 0.0
    assert all(a != 0.3 for a in result["alpha"][1:]) and all(b != 0.3 for b in result["beta"][1:])
    config = json.loads((result["export_dir"] / "config.json").read_text())
    assert config["alpha"] == result["alpha"] and config["beta"] == result["beta"]
    _, _, loaded = load_dels_head(result["export_dir"], embed, 256)
    assert loaded.pure_draft_prefix_len == 1
    # What a draft step applies: exactly the learned schedule (slot 0 zeroed either way).
    for name in ("alpha", "beta"):
        weights = loaded.slot_weights(name, BLOCK - 1)
        applied = slot_schedule(weights, BLOCK - 1, name, "cpu", loaded.pure_draft_prefix_len)
        assert applied.tolist() == pytest.approx(result[name])


def test_realbed_fusion_stage_fits_the_markov_head_over_the_final_drafter(tmp_path, monkeypatch):
    """Stage dels_fusion_markov: recipe smollm2/dels_fusion_markov with the build's paths (the
    final drafter, the Markov folder the dels_markov stage wrote); its export becomes
    drafts/dflash/dels_markov_learned, which ship() keeps."""
    from types import SimpleNamespace

    import training.realbed as realbed
    from training.recipe import load_recipe

    out = (tmp_path / "out").resolve()
    seen = {}

    def fake_fusion(recipe, resume=None, **_):
        seen.update(recipe=recipe, resume=resume)
        export = tmp_path / "fusion_final"
        export.mkdir()
        (export / "config.json").write_text(json.dumps({"alpha": [0.0, 0.4], "beta": [0.0, 0.2]}))
        (export / "model.safetensors").write_bytes(b"head")
        return {"history": [{"step": 1, "ce": 2.0, "long_only_ce": 2.5}], "alpha": [0.0, 0.4],
                "beta": [0.0, 0.2], "export_dir": export,
                "trainer": SimpleNamespace(step=1, output_dir=str(tmp_path / "fusion"))}

    monkeypatch.setattr(realbed, "run_fusion_training", fake_fusion)
    calls = record_realbed_stages(realbed, tmp_path, monkeypatch)
    build = load_recipe("smollm2/build")
    realbed.build(build, tmp_path / "out", log=lambda _: None)
    names = list(calls)
    assert names.index("dels_fusion_markov") == names.index("dels_markov") + 1
    fragment = calls["dels_fusion_markov"]()
    recipe = seen["recipe"]
    assert seen["resume"] is True
    assert recipe["method"] == "dels_fusion"
    assert recipe["drafter"] == str(out / "drafts" / "dflash")
    assert recipe["dels"] == str(out / "drafts" / "dflash" / "dels_markov")
    assert recipe["train"]["output_dir"] == str(out / "runs" / "dels_fusion_markov")
    assert recipe["data"] == str(out / "data" / "train.jsonl") and recipe["target"] == str(tmp_path / "target")
    learned = out / "drafts" / "dflash" / "dels_markov_learned"
    assert fragment["path"] == str(learned) and fragment["alpha"] == [0.0, 0.4]
    assert fragment["train_tail"] == {"ce": 2.0, "long_only_ce": 2.5}
    assert json.loads((learned / "config.json").read_text())["alpha"] == [0.0, 0.4]

    # ship() copies drafts/dflash whole, the learned folder with it.
    for name in realbed.SHIPPED:
        (out / "drafts" / name).mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").write_text(json.dumps({"stages": {}, "recipe": {}}))  # no stage measured yet
    realbed.ship(out, tmp_path / "shipped", log=lambda _: None)
    shipped = tmp_path / "shipped" / "drafts" / "dflash" / "dels_markov_learned"
    assert (shipped / "model.safetensors").read_bytes() == b"head"
    assert not (shipped / "model.safetensors").is_symlink()  # no other file holds these bytes

    # The learned folder's weights are the Markov head's, unchanged: shipped as a relative link.
    (out / "drafts" / "dflash" / "dels_markov").mkdir(exist_ok=True)
    (out / "drafts" / "dflash" / "dels_markov" / "model.safetensors").write_bytes(b"head")
    realbed.ship(out, tmp_path / "shipped", log=lambda _: None)
    link = shipped / "model.safetensors"
    assert link.is_symlink() and str(link.readlink()) == "../dels_markov/model.safetensors"
    assert link.read_bytes() == b"head" and (shipped / "config.json").is_file()

    # Without the recipe entry there is no such stage.
    del build["recipes"]["dels_fusion_markov"]
    calls.clear()
    realbed.build(build, tmp_path / "out", log=lambda _: None)
    assert "dels_fusion_markov" not in calls and "dels_markov" in calls


def test_the_smollm2_fusion_recipe():
    from training.recipe import load_recipe
    from training.trainer import TrainConfig

    recipe = load_recipe("smollm2/dels_fusion_markov")
    assert recipe["method"] == "dels_fusion" and recipe["num_anchors"] == 64
    train = TrainConfig(**recipe["train"])
    assert 100 <= train.max_steps <= 200 and train.batch_size == 4 and train.precision == "auto"
    assert train.optim.lr == {"head": 0.01}
    assert recipe["dels"].endswith("drafts/dflash/dels_markov") and recipe["drafter"].endswith("drafts/dflash")
