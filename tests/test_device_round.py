"""The device round's parts (issue 32): generation through transformers, decontamination, the
trainer sized to a deadline, packing for the trip back, and the campaign table and figure."""

from __future__ import annotations

import json
import subprocess
import time

import pandas as pd
import pytest
import torch

from _training_helpers import patterned_dataset, single_thread, tiny_recipe, tiny_target, toy_trainer  # noqa: F401
from plots.campaign import write_campaign_figure
from training.build_stages.campaign_table import campaign_table
from training.device_round import clean_prompts, pack, unseen_rows
from training.hf_generation import _cut_at_stop, _generate_ids
from training.pipeline import prepare_draft_training


def _row(i, text):
    return {"id": f"p{i}", "messages": [{"role": "user", "content": text}]}


def test_clean_prompts_drops_benchmark_and_heldout_overlaps_and_duplicates(tmp_path):
    bench = "the quick brown fox jumps over the lazy dog and then runs far away into the woods"
    (tmp_path / "b.jsonl").write_text(json.dumps({"turns": [bench]}) + "\n")
    held = "please write a haiku about the autumn leaves falling gently from the old oak tree today"
    prompts = [_row(0, "Rewrite: " + bench.upper()), _row(1, held + " now"), _row(2, "known prompt"),
               _row(3, "a fresh question"), _row(4, "a fresh question")]
    kept, report = clean_prompts(prompts, tmp_path, [_row(9, held)], [_row(8, "known prompt")])
    assert [r["id"] for r in kept] == ["p3"]
    assert report["dropped"] == {"benchmark": 1, "heldout": 1, "duplicate": 2}


def test_greedy_generation_matches_a_plain_argmax_loop():
    model = tiny_target(layers=2)
    rows = [[5, 9, 12], [7, 3]]
    out = _generate_ids(model, rows, max_tokens=6, temperature=0.0, stop_ids={250}, pad_id=0, batch_size=2,
                        generator=None, desc="t", progress=False)
    for row, (tokens, stopped) in zip(rows, out):
        ids = torch.tensor([row])
        for _ in range(6):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        expect = ids[0, len(row):].tolist()
        cut = expect.index(250) if 250 in expect else len(expect)
        assert tokens == expect[:cut] and stopped == (250 in expect)


def test_cut_at_stop():
    assert _cut_at_stop([4, 5, 9, 0, 0], {9}, 0) == ([4, 5], True)
    assert _cut_at_stop([4, 5, 6], {9}, 0) == ([4, 5, 6], False)


def test_pack_round_trips_through_parts(tmp_path):
    payload = tmp_path / "weights.bin"
    payload.write_bytes(torch.randint(0, 256, (3 * 2 ** 20,), dtype=torch.uint8).numpy().tobytes())
    names = pack({"dflash/weights.bin": payload}, tmp_path / "out", part_mib=1)
    assert len(names) >= 3
    extract = tmp_path / "x"
    extract.mkdir()
    parts = [str(tmp_path / "out" / n) for n in names]
    subprocess.run(f"cat {' '.join(parts)} | tar xz -C {extract}", shell=True, check=True)
    assert (extract / "dflash" / "weights.bin").read_bytes() == payload.read_bytes()


def test_a_next_cpu_round_leaves_out_exactly_what_the_last_trainer_drew(tmp_path):
    drawn: list[int] = []

    def make_inputs(indices, epoch):
        drawn.extend(indices)
        return {"x": torch.ones(len(indices), 4)}

    toy_trainer(tmp_path / "run", 40, make_inputs, max_steps=5, batch_size=3, seed=7, save_every=100,
                log_every=100).fit()
    rows = [{"id": f"c{i}"} for i in range(40)]
    record = {"calls": [{"stages": {"tokenize": {"train_examples": 40}, "train": {
        "steps": 5, "global_batch": 3, "recipe": {"train": {"seed": 7}}}}}]}
    kept = unseen_rows(rows, record)
    assert len(drawn) == 15 and {r["id"] for r in kept} == {f"c{i}" for i in range(40) if i not in drawn}
    with pytest.raises(ValueError, match="same --conversations"):
        unseen_rows(rows[:39], record)
    # A third round after the second (--after-round twice, in order): the second trainer drew
    # from what the first left, and neither round's conversations come back.
    second: list[int] = []

    def make_second(indices, epoch):
        second.extend(indices)
        return {"x": torch.ones(len(indices), 4)}

    toy_trainer(tmp_path / "run2", len(kept), make_second, max_steps=4, batch_size=3, seed=9,
                save_every=100, log_every=100).fit()
    record2 = {"calls": [{"stages": {"tokenize": {"train_examples": len(kept)}, "train": {
        "steps": 4, "global_batch": 3, "recipe": {"train": {"seed": 9}}}}}]}
    third = unseen_rows(unseen_rows(rows, record), record2)
    used = {f"c{i}" for i in drawn} | {kept[i]["id"] for i in second}
    assert len(used) == 15 + 12 and {r["id"] for r in third} == {r["id"] for r in rows} - used


def test_retarget_refits_the_schedule_and_deadline_stops_with_a_checkpoint(tmp_path):
    run = prepare_draft_training(tiny_recipe("dflash", tmp_path / "run", max_steps=40),
                                 target_model=tiny_target(), dataset=patterned_dataset(), progress=False)
    trainer = run.trainer
    trainer.total_steps = 2
    trainer.fit()
    trainer.retarget(10)
    lrs = []
    while trainer.step < 10:
        trainer.train_step()
        lrs.append(trainer.optimizer.param_groups[0]["lr"])
    assert lrs[-1] == pytest.approx(0.0, abs=1e-12)  # the cosine ends at the new length
    trainer.retarget(30)
    trainer.fit(deadline=time.time() - 1)
    assert trainer.step == 11 and trainer.latest_checkpoint().name == "step_00000011"


def test_campaign_table_and_figure(tmp_path):
    manifest = {"stages": {
        "measure": {"heldout_tau": {"dflash_round1": 1.5, "dflash": 1.6}},
        "tokenize": {"train": {"examples": 40}},
        "dflash": {"parent_build": {"recipe": {"train": {"batch_size": 4}}, "steps": 10}},
        "dflash_round2": {"recipe": {"train": {"batch_size": 4}}, "steps": 5}}}
    call = {"calls": [{"stages": {"device": {"name": "GPU"}, "tokenize": {"train_examples": 400},
                                  "train": {"global_batch": 32, "examples": 400, "curve": [
                                      {"step": 0, "sequences_seen": 0, "heldout_tau": 1.6},
                                      {"step": 10, "sequences_seen": 320, "heldout_tau": 1.8}]}}}]}
    # A CPU round on 100 new conversations (device_round --conversations) after the GPU's 400,
    # of which it reached 20.
    cpu = {"calls": [{"stages": {"device": {"name": "cpu"},
                                 "tokenize": {"train_examples": 100, "new_conversations": 100, "sources": ["x"]},
                                 "train": {"global_batch": 4, "examples": 100, "curve": [
                                     {"step": 0, "sequences_seen": 0, "heldout_tau": 1.8},
                                     {"step": 5, "sequences_seen": 20, "heldout_tau": 1.85}]}}}]}
    table = campaign_table(manifest, [call, cpu])
    assert table["sequences_seen"].tolist() == [40, 60, 60, 380, 380, 400]
    assert table["distinct_conversations"].tolist() == [40, 40, 400, 400, 420, 420]
    assert table["phase"].tolist()[2:] == ["device 1", "device 1", "CPU 1", "CPU 1"]
    table.to_csv(tmp_path / "c.csv", index=False)
    paths = write_campaign_figure(tmp_path / "c.csv", tmp_path / "fig")
    assert all(p.stat().st_size > 1000 for p in paths)
    with pytest.raises(ValueError, match="heldout_tau"):
        pd.DataFrame({"phase": ["x"]}).to_csv(tmp_path / "bad.csv", index=False)
        write_campaign_figure(tmp_path / "bad.csv", tmp_path / "fig")


def test_next_replies_waits_on_the_rounds_clean_unanswered_prompts_in_order(tmp_path):
    import gzip

    from training.next_replies import waiting_prompts

    def gz(path, rows):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)

    bench = "the quick brown fox jumps over the lazy dog and then runs far away into the woods"
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "b.jsonl").write_text(json.dumps({"turns": [bench]}) + "\n")
    round_dir, snapshot = tmp_path / "round", tmp_path / "snapshot"
    round_dir.mkdir(), snapshot.mkdir()
    prompts = [_row(i, f"question number {i}") for i in range(5)] + [_row(5, "Say: " + bench)]
    gz(round_dir / "magpie.jsonl.gz", prompts)
    answered = [dict(_row(1, "question number 1"), messages=[{"role": "user", "content": "question number 1"},
                                                               {"role": "assistant", "content": "a"}])]
    gz(round_dir / "replies.jsonl.gz", answered)
    gz(snapshot / "train_regenerated.jsonl.gz", [_row(8, "question number 3")])
    gz(snapshot / "heldout_regenerated.jsonl.gz", [_row(9, "a held-out prompt")])
    waiting, report = waiting_prompts(round_dir, snapshot, tmp_path / "eval")
    assert [r["id"] for r in waiting] == ["p0", "p2", "p4"]  # p1 answered, p3 known, p5 a benchmark's
    assert report["waiting"] == 3 and report["answered_by_round"] == 1
