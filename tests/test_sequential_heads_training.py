"""DSpark and Domino trained jointly with the drafter: the heads learn, the exports have the
formats their readers expect, and teacher forcing is the sequential drafting it stands for."""

import json

import pytest
import torch
from safetensors.torch import load_file

from _training_helpers import single_thread  # noqa: F401 (autouse)
from _training_helpers import patterned_dataset, tiny_recipe, tiny_target
from training.export import load_dflash, read_draft_vocab
from training.pipeline import run_draft_training
from vllm_liliprop.heads.domino import DominoConfig, DominoHead, load_domino_head
from vllm_liliprop.heads.dspark import MarkovBiasHead
from vllm_liliprop.heads.sequential import sampled_pick, sequential_draft


def _random_heads(vocab=40, width=8, rank=3, ids=None):
    torch.manual_seed(0)
    ids = torch.arange(vocab) if ids is None else ids
    heads = [MarkovBiasHead(vocab, ids.numel(), rank, scale=1.5),
             DominoHead(DominoConfig(vocab, width, width, rank), torch.randn(vocab, width), ids)]
    for head in heads:
        for param in head.parameters():
            torch.nn.init.normal_(param)
    return heads


@pytest.mark.parametrize("kind", [0, 1], ids=["dspark", "domino"])
def test_teacher_forcing_equals_sequential_drafting(kind):
    """Fed the tokens it drafted, the teacher-forced residual reproduces every slot's scores, so
    training optimises exactly what serving computes (over a reduced vocabulary too)."""
    ids = torch.tensor(sorted(torch.randperm(40, generator=torch.Generator().manual_seed(1))[:25].tolist()))
    head = _random_heads(ids=ids)[kind]
    base, hidden = torch.randn(4, 5, 25), torch.randn(4, 5, 8)
    anchor = torch.randint(0, 40, (4,))
    drafts, faulty = sequential_draft(base, anchor, hidden, head, vocab_ids=ids)
    prev = torch.cat([anchor[:, None], ids[drafts[:, :-1]]], dim=1)
    with torch.no_grad():
        scores = base + head.teacher_forced(prev, hidden)
    assert torch.equal(scores.argmax(-1), drafts) and not faulty.any()
    # Drafts depend on the previous token: a different anchor changes the block.
    assert not torch.equal(sequential_draft(base, (anchor + 1) % 40, hidden, head, vocab_ids=ids)[0], drafts)


def test_sampled_drafting_returns_the_distributions_it_drew_from():
    head = _random_heads()[0]
    base, hidden = torch.randn(3, 4, 40), torch.randn(3, 4, 8)
    anchor = torch.tensor([1, 2, 3])
    probs = torch.empty(3, 4, 40)
    temperature = torch.tensor([0.0, 1.0, 0.7])
    drafts, _ = sequential_draft(base, anchor, hidden, head,
                                 sampled_pick(temperature, probs, torch.Generator().manual_seed(0)))
    assert torch.allclose(probs.sum(-1), torch.ones(3, 4))
    assert torch.equal(drafts[0], sequential_draft(base[:1], anchor[:1], hidden[:1], head)[0][0])
    assert (probs.gather(-1, drafts[..., None]) > 0).all()
    prev = torch.cat([anchor[:, None], drafts[:, :-1]], dim=1)
    with torch.no_grad():
        expected = torch.softmax((base + head.teacher_forced(prev, hidden))[2] / 0.7, dim=-1)
    torch.testing.assert_close(probs[2], expected)


def test_nan_scores_flag_the_row():
    head = _random_heads()[0]
    with torch.no_grad():
        head.markov_w1.weight[7] = float("nan")
    base, hidden = torch.randn(2, 3, 40), torch.randn(2, 3, 8)
    _, faulty = sequential_draft(base, torch.tensor([7, 8]), hidden, head)
    assert faulty.tolist() == [True, False]


@pytest.mark.parametrize("method", ["dspark", "domino"])
def test_joint_training_learns_and_exports(method, tmp_path):
    dataset, target = patterned_dataset(), tiny_target()
    recipe = tiny_recipe(method, tmp_path / "run", max_steps=12, save_every=100)
    recipe.update(train_vocab={"size": 12}, **{method: {"markov_rank" if method == "dspark" else "rank": 4}})
    result = run_draft_training(recipe, target_model=target, dataset=dataset, progress=False)
    losses = [h["loss"] for h in result["history"]]
    assert losses[-1] < losses[0]
    head = result["trainer"].trainable["head"]
    projection = head.markov_w2 if method == "dspark" else head.up
    assert projection.weight.abs().sum() > 0  # zero-initialised, so it learned something
    export = result["export_dir"]
    config = json.loads((export / "config.json").read_text())
    ids = read_draft_vocab(export)
    assert config["draft_vocab_size"] == 12 and ids.numel() == 12
    load_dflash(export)  # the backbone reloads without the head's tensors
    from training.build_stages.measure import sequential_head_acceptance

    tau = sequential_head_acceptance(export, method, target, dataset, num_anchors=8, seed=0)
    assert 1.0 <= tau <= recipe["drafter"]["block_size"]
    tensors = load_file(str(export / "model.safetensors"))
    if method == "dspark":
        assert config["architectures"] == ["Qwen3DSparkModel"]
        assert config["markov_rank"] == 4 and config["sample_from_anchor"] is False
        assert tensors["markov_head.markov_w1.weight"].shape == (256, 4)
        assert tensors["markov_head.markov_w2.weight"].shape == (12, 4)
    else:
        assert config["dflash_config"]["liliprop"]["rule"] == "domino"
        assert not any(name.startswith("domino") for name in tensors)
        embed = target.get_input_embeddings().weight
        loaded = load_domino_head(export / "domino", embed)
        assert torch.equal(loaded.vocab_ids, ids)
        torch.testing.assert_close(loaded.up.weight, head.up.weight.detach().to(torch.bfloat16).float())


def test_bad_domino_folders_are_refused(tmp_path):
    head = _random_heads()[1]
    from vllm_liliprop.heads.domino import save_domino_head

    folder = save_domino_head(tmp_path / "domino", head, torch.float32)
    with pytest.raises(ValueError, match="embed_size"):
        load_domino_head(folder, torch.randn(40, 9))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "rank": 5}))
    with pytest.raises(ValueError, match="does not match its config.json"):
        load_domino_head(folder, torch.randn(40, 8))
    with pytest.raises(ValueError, match="no Domino head"):
        load_domino_head(tmp_path / "elsewhere", torch.randn(40, 8))
