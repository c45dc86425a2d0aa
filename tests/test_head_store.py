"""The head store and head training from it (issue 33), on the tiny testbed's target and draft:
the store's argmax acceptance is the measure stage's, oracle taus grow with K, and a head trained
from the store learns (its training loss falls) and exports as a LiLiCorr draft that loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from _training_helpers import single_thread  # noqa: F401
from training.build_stages.measure import drafter_acceptance
from training.data import TokenizedDataset
from training.export import load_dflash, load_lilicorr
from training.head_store import build_store, first_slots, load_store
from training.headroom_metrics import accepted_lengths, headroom_metrics
from training.train_head import lattice_metrics, store_ranks, train_head

TINY = Path(__file__).resolve().parents[1] / "testbed" / "tiny"


@torch.no_grad()
def _dataset() -> TokenizedDataset:
    """The target's own greedy continuations of random prompts (what a drafter is trained on)."""
    target = AutoModelForCausalLM.from_pretrained(TINY / "target", dtype=torch.float32).eval()
    prompts = torch.randint(10, 2000, (4, 8), generator=torch.Generator().manual_seed(0))
    ids = target.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=40, do_sample=False,
                          min_new_tokens=40, pad_token_id=0).tolist()
    return TokenizedDataset(ids, [[False] * 8 + [True] * 40 for _ in ids])


DATA = _dataset()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    out = tmp_path_factory.mktemp("store")
    target = AutoModelForCausalLM.from_pretrained(TINY / "target", dtype=torch.float32).eval()
    record = build_store(TINY / "drafts" / "dflash", target, DATA, out, anchors=6, seed=0,
                         shard_blocks=10, progress=False)
    return out, record, target


def test_store_matches_the_measure_stage_and_resumes(store):
    out, record, target = store
    assert record["blocks"] == 24 and len(list(out.glob("shard_*.safetensors"))) >= 2
    blocks = load_store(out)
    taus = list(headroom_metrics(*store_ranks(blocks))["oracle_tau"].values())
    assert taus == sorted(taus)
    measured = drafter_acceptance(TINY / "drafts" / "dflash", False, target, DATA, 6, 0)
    assert taus[0] == pytest.approx(1 + measured["accept_argmax"], abs=0.05)
    again = build_store(TINY / "drafts" / "dflash", target, DATA, out, anchors=6, seed=0,
                        shard_blocks=10, progress=False)
    assert again["blocks"] == 24  # nothing recomputed or duplicated


def test_head_trains_from_the_store_and_exports(store, tmp_path):
    out, _, target = store
    blocks = load_store(out)
    drafter = load_dflash(TINY / "drafts" / "dflash")
    recipe = {"lattice": {"candidate_topk": 4, "hidden_size": 32, "num_layers": 1, "num_heads": 2,
                          "factor_dim": 16},
              "loss": {"distractor": 1.0},
              "train": {"steps": 30, "batch_blocks": 16, "lr": 3e-3, "eval_every": 30, "log_every": 1}}
    embed = target.get_input_embeddings().weight.detach()
    head, curve = train_head(recipe, blocks, blocks, embed, drafter.config, tmp_path, progress=False)
    losses = [json.loads(line)["loss"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert losses[-1] < losses[0]
    assert set(curve[-1]) >= {"walk_tau", "argmax_tau", "oracle4_tau", "headroom_share"}
    assert curve[-1] == {**curve[-1], **lattice_metrics(head, blocks, embed)}
    # scored_slots: the whole lattice walked, its first 2 picks counted; the argmax is the
    # 2-slot store's, and counting every slot is the default.
    scored = lattice_metrics(head, blocks, embed, scored_slots=2)
    assert scored["argmax_tau"] == pytest.approx(headroom_metrics(*store_ranks(first_slots(blocks, 2)))["argmax_tau"],
                                                 abs=1e-4)
    assert 1.0 <= scored["walk_tau"] <= min(3.0, curve[-1]["walk_tau"])
    assert lattice_metrics(head, blocks, embed, scored_slots=blocks["targets"].shape[1]) == lattice_metrics(
        head, blocks, embed)


def test_learned_prior_is_exported_and_head_eval_measures_the_export(store, tmp_path):
    """train.prior_weight: the prior's weight is learned, exported in the draft's config
    (liliprop_lattice_prior_weight), and the exported draft measures as its curve's last row;
    a slice of the training store is measured beside the held-out one."""
    from training.export import export_lilicorr
    from training.head_eval import evaluate
    from vllm_liliprop.heads.lattice_prior import PRIOR_KEY

    out, _, target = store
    blocks = load_store(out)
    drafter = load_dflash(TINY / "drafts" / "dflash")
    recipe = {"lattice": {"candidate_topk": 4, "hidden_size": 32, "num_layers": 1, "num_heads": 2,
                          "factor_dim": 16},
              "train": {"steps": 20, "batch_blocks": 16, "lr": 3e-3, "eval_every": 20, "prior_weight": 1.0,
                        "eval_train_blocks": 8}}
    embed = target.get_input_embeddings().weight.detach()
    head, curve = train_head(recipe, blocks, blocks, embed, drafter.config, tmp_path, progress=False)
    assert curve[0]["prior_weight"] == 1.0 and curve[-1]["prior_weight"] != 1.0
    assert {"train_walk_tau", "train_headroom_share"} <= set(curve[-1])
    assert head.config.prior_weight == pytest.approx(curve[-1]["prior_weight"], abs=1e-4)
    export_lilicorr(tmp_path / "draft", drafter, head.float(), torch.float32)
    config = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert config["dflash_config"][PRIOR_KEY] == head.config.prior_weight
    [row] = evaluate([str(tmp_path / "draft")], [str(out)], embed)
    assert row["walk_tau"] == pytest.approx(curve[-1]["walk_tau"], abs=0.05)


def test_first_slots_measures_what_k_slots_serve(store, tmp_path):
    """train.slots: a store cut to its first 2 slots gives the argmax tau of blocks whose
    accepted length is capped at 2, and a head trained on the cut store runs on 2-slot lattices;
    a slot count the store lacks is refused with the field named."""
    out, _, target = store
    blocks = load_store(out)
    cut = first_slots(blocks, 2)
    assert cut["slot_hidden"].shape[1] == 2 and torch.equal(cut["anchor_hidden"], blocks["anchor_hidden"])
    rank, valid = store_ranks(blocks)
    capped = accepted_lengths(valid & (rank == 0)).clamp(max=2).float().mean().item() + 1
    assert headroom_metrics(*store_ranks(cut))["argmax_tau"] == pytest.approx(capped)
    assert first_slots(blocks, None) is blocks
    with pytest.raises(ValueError, match="train.slots / --slots = 9"):
        first_slots(blocks, 9)
    recipe = {"lattice": {"candidate_topk": 4, "hidden_size": 32, "num_layers": 1, "num_heads": 2,
                          "factor_dim": 16},
              "train": {"steps": 5, "batch_blocks": 8, "lr": 3e-3, "eval_every": 5}}
    embed = target.get_input_embeddings().weight.detach()
    head, curve = train_head(recipe, cut, cut, embed, load_dflash(TINY / "drafts" / "dflash").config, tmp_path,
                             progress=False)
    assert curve[-1] == {**curve[-1], **lattice_metrics(head, cut, embed)}


def test_a_warm_start_begins_where_its_export_ended_and_slot_weights_pick_the_slots(store, tmp_path):
    """train.init starts from an exported LiLiCorr draft's head (its step-0 row is the export's
    metrics); loss.slot_weights weights each slot's term: all ones is the plain slot mean, and
    weight on slot 0 alone is slot 0's term alone."""
    from training.export import export_lilicorr
    from training.train_head import head_loss, walk_scores

    out, _, target = store
    blocks = load_store(out)
    drafter = load_dflash(TINY / "drafts" / "dflash")
    lattice = {"candidate_topk": 4, "hidden_size": 32, "num_layers": 1, "num_heads": 2, "factor_dim": 16}
    recipe = {"lattice": lattice, "train": {"steps": 20, "batch_blocks": 16, "lr": 3e-3, "eval_every": 20}}
    embed = target.get_input_embeddings().weight.detach()
    (tmp_path / "a").mkdir()
    head, curve = train_head(recipe, blocks, blocks, embed, drafter.config, tmp_path / "a", progress=False)
    export_lilicorr(tmp_path / "draft", drafter, head.float(), torch.float32)
    warm = {**recipe, "train": {**recipe["train"], "steps": 1, "lr": 0.0, "init": str(tmp_path / "draft")}}
    (tmp_path / "b").mkdir()
    _, warm_curve = train_head(warm, blocks, blocks, embed, drafter.config, tmp_path / "b", progress=False)
    assert {k: warm_curve[0][k] for k in ("walk_tau", "headroom_share")} == \
        {k: curve[-1][k] for k in ("walk_tau", "headroom_share")}

    rows = torch.arange(blocks["targets"].shape[0])
    start, pairs, ids = walk_scores(head, None, blocks, rows, 4, embed)
    targets, logq = blocks["targets"].long(), blocks["target_logq"][:, :, :4]
    slots = ids.shape[1]
    plain = head_loss(start, pairs, ids, targets, logq, {})
    ones = head_loss(start, pairs, ids, targets, logq, {"slot_weights": [1.0] * slots})
    torch.testing.assert_close(ones["loss"], plain["loss"])
    first = head_loss(start, pairs, ids, targets, logq, {"slot_weights": [1.0] + [0.0] * (slots - 1)})
    alone = head_loss(start, pairs[:, :0], ids[:, :1], targets[:, :1], logq[:, :1], {})
    torch.testing.assert_close(first["loss"], alone["loss"])
    assert not torch.allclose(first["loss"], plain["loss"])


def test_a_candidate_vocabulary_without_a_reduced_vocabulary_is_refused(tmp_path):
    """--candidate-vocab names a draft whose d2t gives the ids; a full-vocabulary draft has none."""
    target = AutoModelForCausalLM.from_pretrained(TINY / "target", dtype=torch.float32).eval()
    with pytest.raises(ValueError, match="--candidate-vocab .*no reduced vocabulary"):
        build_store(TINY / "drafts" / "dflash", target, DATA, tmp_path, anchors=2, seed=0,
                    candidate_vocab=TINY / "drafts" / "dflash", progress=False)
