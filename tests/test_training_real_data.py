"""The pieces training.realbed adds for a real target: distillation to the teacher-forced target,
a training vocabulary, Magpie prompts, decontamination against the eval prompts, resumable stages."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from tests._training_helpers import VOCAB, patterned_dataset, tiny_recipe, tiny_target
from training.data import training_vocabulary
from training.decontaminate import decontaminate_file, ngrams
from training.losses import LossWeights, total_loss
from training.magpie import clean_turn, user_header
from training.pipeline import run_draft_training
from training.stages import run_stage


def test_distill_mixes_ce_with_kl_to_the_teacher():
    torch.manual_seed(0)
    logits, teacher = torch.randn(2, 3, 7), torch.randn(2, 3, 7)
    targets = teacher.argmax(-1)
    mask = torch.ones(2, 3, dtype=torch.bool)
    decay = 4.0
    w = torch.exp(-torch.arange(3) / decay).expand(2, 3)
    ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(2, 3)
    kl = F.kl_div(logits.log_softmax(-1), teacher.log_softmax(-1), log_target=True, reduction="none").sum(-1)
    for share in (0.0, 0.3, 1.0):
        terms = total_loss(draft_logits=logits, targets=targets, slot_mask=mask, teacher_logits=teacher,
                           weights=LossWeights(dflash_decay=decay, distill=share))
        expected = ((1 - share) * ce + share * kl).mul(w).sum() / w.sum()
        torch.testing.assert_close(terms["dflash"], expected)
    with pytest.raises(ValueError, match="teacher_logits are required"):
        total_loss(draft_logits=logits, targets=targets, slot_mask=mask, weights=LossWeights(distill=0.5))
    with pytest.raises(ValueError, match="distill must be in"):
        LossWeights(distill=1.5)


def test_training_vocabulary_is_the_most_supervised_tokens():
    dataset = patterned_dataset()
    counts = dataset.supervised_token_counts(VOCAB)
    ids, coverage = training_vocabulary(dataset, VOCAB, 5)
    assert ids.tolist() == sorted(ids.tolist()) and len(ids) == 5
    assert counts[ids].min() >= counts[[t for t in range(VOCAB) if t not in ids.tolist()]].max()
    assert coverage == pytest.approx(float(counts[ids].sum() / counts.sum()))
    full, everything = training_vocabulary(dataset, VOCAB, VOCAB)
    assert everything == 1.0 and len(full) == VOCAB
    with pytest.raises(ValueError, match="train_vocab.size"):
        training_vocabulary(dataset, VOCAB, 0)


def test_distilled_run_on_a_training_vocabulary_learns_and_exports_full_vocab(tmp_path):
    dataset = patterned_dataset()
    recipe = tiny_recipe("dflash", tmp_path / "run", max_steps=20, save_every=100)
    recipe["train"]["optim"]["lr"] = {"drafter": 1e-2, "head": 1e-2}
    recipe["loss"] = {"dflash_decay": 4.0, "distill": 0.5}
    recipe["train_vocab"] = {"size": 64}
    before = run_draft_training({**recipe, "train": {**recipe["train"], "max_steps": 0,
                                                     "output_dir": str(tmp_path / "r0")}},
                                target_model=tiny_target(), dataset=dataset, progress=False)
    result = run_draft_training(recipe, target_model=tiny_target(), dataset=dataset, progress=False)
    everything = list(range(len(dataset)))
    start, end = before["trainer"].evaluate(everything), result["trainer"].evaluate(everything)
    assert end["dflash"] < 0.5 * start["dflash"] and end["accept_argmax"] > start["accept_argmax"]
    objective = result["trainer"].model
    assert objective.lm_head_weight.shape[0] == 64
    # Labels outside the training vocabulary are not supervised; inside, they map to its rows.
    targets = torch.tensor([[int(objective.vocab_ids[3]), -1, VOCAB - 1]])
    mapped, mask = objective._train_labels(targets, torch.ones(1, 3, dtype=torch.bool))
    outside = VOCAB - 1 not in objective.vocab_ids.tolist()
    assert mapped[0, 0] == 3 and mask.tolist() == [[True, False, not outside]]
    config = json.loads((result["export_dir"] / "config.json").read_text())
    assert config["vocab_size"] == VOCAB  # the export drafts over the full vocabulary


class _ChatMLTokenizer:
    def apply_chat_template(self, messages, tokenize=False):
        return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def test_magpie_header_and_turn_cleaning():
    assert user_header(_ChatMLTokenizer()) == "<|im_start|>user\n"
    assert clean_turn("Write a Python function that", "sorts a list.", 10) == \
        "Write a Python function that sorts a list."
    assert clean_turn("", "  What is 2+2?  ", 5) == "What is 2+2?"
    assert clean_turn("", "hi", 5) is None


def test_decontamination_drops_a_13_gram_copy_of_an_eval_prompt(tmp_path):
    eval_dir = tmp_path / "eval"
    eval_dir.mkdir()
    question = ("Natalia sold clips to forty eight of her friends in April and then she sold half "
                "as many clips in May")
    (eval_dir / "gsm8k.jsonl").write_text(json.dumps({"id": "q", "turns": [question]}) + "\n")
    rows = [{"id": "copy", "messages": [{"role": "user", "content": "Solve: " + question.upper() + "!"}]},
            {"id": "twelve", "messages": [{"role": "user", "content": " ".join(question.split()[:12])}]},
            {"id": "other", "messages": [{"role": "user", "content": "Write a poem about the sea."}]}]
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = decontaminate_file(source, eval_dir, tmp_path / "clean.jsonl")
    assert (report["input"], report["kept"], report["dropped"]) == (3, 2, 1)
    assert report["dropped_ids"] == ["copy"]
    kept = [json.loads(line)["id"] for line in (tmp_path / "clean.jsonl").read_text().splitlines()]
    assert kept == ["twelve", "other"]
    assert len(ngrams(question, 13)) == len(question.split()) - 12


def test_a_finished_stage_is_not_run_again(tmp_path):
    calls = []

    def work():
        calls.append(1)
        return {"rows": 3}

    first = run_stage(tmp_path, "count", work, log=lambda _: None)
    again = run_stage(tmp_path, "count", work, log=lambda _: None)
    assert calls == [1] and first["rows"] == again["rows"] == 3 and "seconds" in again
    with pytest.raises(RuntimeError):
        run_stage(tmp_path, "broken", lambda: (_ for _ in ()).throw(RuntimeError("x")), log=lambda _: None)
    assert not (tmp_path / "stages" / "broken.json").exists()


def test_fp32_training_distills_from_a_bf16_target(tmp_path):
    """A bf16 target's final hidden states meet the fp32 LM head in fp32 training (precision
    auto picks fp32 on a CPU without AMX): this used to stop with a dtype error."""
    recipe = tiny_recipe("dflash", tmp_path / "run", max_steps=2, save_every=100)
    recipe["loss"] = {"dflash_decay": 4.0, "distill": 0.5}
    result = run_draft_training(recipe, target_model=tiny_target().to(torch.bfloat16),
                                dataset=patterned_dataset(), progress=False)
    assert result["trainer"].step == 2 and all(torch.isfinite(torch.tensor(h["loss"])) for h in result["history"])


def test_fast_dtype_follows_the_measured_bf16_speed(monkeypatch):
    import vllm_liliprop.host as host

    for speedup, expected in ((4.3, "bfloat16"), (1.3, "bfloat16"), (0.8, "float32"), (0.01, "float32")):
        monkeypatch.setattr(host, "cpu_bf16_matmul_speedup", lambda speedup=speedup: speedup)
        assert host.fast_dtype() == expected
    assert host.fast_dtype("cuda") == "bfloat16"


def test_auto_precision_is_bf16_only_where_it_is_fast(monkeypatch):
    import training.trainer as trainer

    for speedup, expected in ((4.3, "bf16"), (2.3, "bf16"), (0.8, "fp32")):
        monkeypatch.setattr(trainer, "cpu_bf16_matmul_speedup", lambda speedup=speedup: speedup)
        assert trainer.auto_precision(torch.device("cpu")) == expected
    assert trainer.auto_precision(torch.device("cuda")) == "bf16"
    from vllm_liliprop.host import cpu_bf16_matmul_speedup

    assert 0.001 < cpu_bf16_matmul_speedup(size=128, repeats=1) < 100  # runs; AVX2 hosts measure 0.01-0.04
    from training import startup

    monkeypatch.setattr(startup, "auto_precision", lambda device: "fp32")
    assert startup.target_dtype("auto", torch.device("cpu")) == torch.float32
    assert startup.target_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    monkeypatch.setattr(startup, "auto_precision", lambda device: "bf16")
    assert startup.target_dtype("auto", torch.device("cpu")) == torch.bfloat16
