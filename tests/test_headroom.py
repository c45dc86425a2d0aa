"""Headroom metrics (issue 33): the pure computation by hand, and over a small trained drafter
through the measure stage's acceptance and the `python -m training.headroom` command."""

import json

import pytest
import torch

from _training_helpers import single_thread  # noqa: F401 (autouse)
from _training_helpers import MASK_TOKEN, patterned_dataset, tiny_recipe, tiny_target
from training.blocks import build_blocks, sample_anchors
from training.build_stages.measure import acceptance
from training.data import collate
from training.export import export_dflash, export_lilicorr
from training.features import OnlineFeatures, frozen_target_weights
from training.headroom_metrics import headroom_metrics, headroom_table
from training.losses import LossWeights
from training.objective import DraftObjective, true_token_rank
from training.pipeline import build_drafter, build_lattice
from training.trainer import seeds_for


def test_true_token_rank_breaks_ties_as_argmax_does():
    logits = torch.tensor([[2.0, 5.0, 5.0, 1.0]]).expand(5, 4)
    ranks = true_token_rank(logits, torch.tensor([1, 2, 0, 3, -1]))
    assert ranks.tolist() == [0, 1, 2, 3, 4]  # -1 (no true token): V, within no top-K
    tied = torch.randint(0, 3, (50, 6, 7)).float()  # many ties
    truth = torch.randint(0, 7, (50, 6))
    assert torch.equal(true_token_rank(tied, truth) == 0, tied.argmax(-1) == truth)


def test_headroom_metrics_known_answer():
    # Four blocks of three slots; block 3's last slot is past the data (rank 0 there is ignored).
    ranks = torch.tensor([[0, 0, 0], [1, 0, 5], [0, 3, 0], [0, 0, 0]])
    valid = torch.tensor([[True] * 3] * 3 + [[True, True, False]])
    walk = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 0, 1], [1, 1, 1]]).bool()
    m = headroom_metrics(ranks, valid, walk)
    # Accepted lengths: argmax 3,0,1,2; @2 3,2,1,2; @4 3,2,3,2; @8 and @16 3,3,3,2; walk 2,2,1,2.
    assert m["blocks"] == 4 and m["argmax_tau"] == 2.5 and m["walk_tau"] == 2.75
    assert m["oracle_tau"] == {"1": 2.5, "2": 3.0, "4": 3.5, "8": 3.75, "16": 3.75}
    assert m["walk_share"] == {"1": None, "2": 0.5, "4": 0.25, "8": 0.2, "16": 0.2}
    # Slot 0: 3 of 4; slot 1: 2 of the 3 right at slot 0; slot 2: blocks 0 and 3 reach it, and
    # block 3's has no true token (a miss, as in tau): 0.75 + 0.75 * 2/3 + 0.75 * 2/3 * 1/2 = 1.5.
    assert m["slot_acceptance"] == [0.75, 2 / 3, 0.5] and m["slot_blocks"] == [4, 3, 2]
    assert "walk_tau" not in headroom_metrics(ranks, valid)
    table = headroom_table(m)
    assert "oracle@16" in table and "walk" in table and "0.667" in table


def _trained_draft():
    """A tiny drafter and LiLiCorr head, the drafter fitted for a few steps on the patterned data
    so that true tokens sit at varied ranks (a random one would rank them nowhere)."""
    target, dataset = tiny_target(), patterned_dataset()
    recipe = tiny_recipe("lilicorr", "unused")
    torch.manual_seed(0)
    drafter = build_drafter(recipe["drafter"], target.config)
    lattice = build_lattice(recipe["lattice"], drafter.config)
    embed, head = frozen_target_weights(target)
    objective = DraftObjective(drafter, embed, head, weights=LossWeights(dflash_decay=4.0, distractor=0.0),
                               num_anchors=8)
    features = OnlineFeatures(target, drafter.config.target_layer_ids, final_hidden=False)
    batch = collate([dataset[i] for i in range(4)])
    taps = features(batch)["target_taps"]
    optimizer = torch.optim.Adam(drafter.parameters(), lr=3e-2)
    for _ in range(20):
        optimizer.zero_grad()
        objective(batch["input_ids"], batch["loss_mask"], taps, [0, 1, 2, 3])["dflash"].backward()
        optimizer.step()
    return target, dataset, drafter, lattice


@pytest.fixture(scope="module")
def trained():
    threads = torch.get_num_threads()  # the autouse single_thread is per test, set up after this
    torch.set_num_threads(1)
    yield _trained_draft()
    torch.set_num_threads(threads)


def test_oracle_is_monotone_and_starts_at_the_measured_argmax(trained):
    target, dataset, drafter, lattice = trained
    measured = acceptance(drafter, lattice, None, target, dataset, num_anchors=8, seed=0)
    m = measured["headroom"]
    oracle = [m["oracle_tau"][k] for k in ("1", "2", "4", "8", "16")]
    assert oracle == sorted(oracle) and oracle[-1] > oracle[0]
    assert oracle[0] == m["argmax_tau"] == pytest.approx(1 + measured["accept_argmax"], abs=1e-6)
    assert m["walk_tau"] == pytest.approx(1 + measured["accept_walk"], abs=1e-6)
    assert m["blocks"] == 8 * len(dataset)
    # P(first s + 1 slots right) is the running product of the conditional rates (0 once a slot
    # is reached by no block), and the mean accepted length is their sum.
    reached, total = 1.0, 0.0
    for rate in m["slot_acceptance"]:
        reached *= rate or 0.0
        total += reached
    assert m["slot_blocks"][0] == m["blocks"] and total == pytest.approx(m["argmax_tau"] - 1, abs=1e-9)


def _valid_prefix_tau(dataset, block_size, num_anchors, seed):
    """1 + mean number of leading slots that have a true token, over the measure's blocks."""
    lengths = []
    for i in range(len(dataset)):
        batch = collate([dataset[i]])
        anchors, valid = sample_anchors(batch["loss_mask"], num_anchors, seeds_for([i], seed, 0))
        _, _, mask = build_blocks(batch["input_ids"], batch["loss_mask"], anchors, valid, block_size, MASK_TOKEN)
        lengths.append(mask[valid].long().cumprod(-1).sum(-1))
    return 1 + float(torch.cat(lengths).float().mean())


def test_a_reduced_vocabulary_ranks_within_it(trained):
    target, dataset, drafter, _ = trained
    full = acceptance(drafter, None, None, target, dataset, num_anchors=8, seed=0)["headroom"]
    # Exactly the 16 motif tokens, the only supervised ones: every true token is within the top
    # 16 of that vocabulary, so only the data's end stops the oracle; over all 256 it is not.
    motif = acceptance(drafter, None, torch.arange(16), target, dataset, num_anchors=8, seed=0)["headroom"]
    assert motif["oracle_tau"]["16"] == pytest.approx(_valid_prefix_tau(dataset, 4, 8, 0), abs=1e-6)
    assert full["oracle_tau"]["16"] < motif["oracle_tau"]["16"]


def test_the_command_reads_both_draft_kinds(trained, tmp_path, capsys):
    from training.headroom import main

    target, dataset, drafter, lattice = trained
    target.save_pretrained(tmp_path / "target")
    dataset.save(tmp_path / "heldout.jsonl")
    export_lilicorr(tmp_path / "lilicorr", drafter, lattice, torch.float32)
    _, lm_head = frozen_target_weights(target)
    export_dflash(tmp_path / "dflash", drafter, torch.float32, draft_vocab=(torch.arange(40), lm_head))
    common = ["--target", str(tmp_path / "target"), "--data", str(tmp_path / "heldout.jsonl"),
              "--anchors", "8", "--seed", "0", "--limit", "5"]
    walk = main(["--draft", str(tmp_path / "lilicorr"), "--lilicorr", *common, "--json", str(tmp_path / "m.json")])
    assert json.loads((tmp_path / "m.json").read_text()) == walk
    assert walk["examples"] == 5 and walk["blocks"] == 40 and "walk_tau" in walk
    assert "oracle@16" in capsys.readouterr().out
    # The same blocks as the in-memory measurement of the first five examples.
    subset = type(dataset)(dataset.input_ids[:5], dataset.loss_masks[:5])
    expected = acceptance(drafter, None, torch.arange(40), target, subset, num_anchors=8, seed=0)["headroom"]
    plain = main(["--draft", str(tmp_path / "dflash"), *common])
    assert "walk_tau" not in plain
    assert plain["oracle_tau"] == {k: round(v, 4) for k, v in expected["oracle_tau"].items()}
