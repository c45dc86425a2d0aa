"""The data snapshot (training/build_stages/snapshot.py): a build's generated prompts and
replies, kept in the repository and seeded into a later build's folder."""

from __future__ import annotations

import gzip
import json

import pytest

from training.build_stages.snapshot import SNAPSHOT_FILES, seed_from_snapshot, write_snapshot
from training.recipe import load_recipe
from training.stages import stage_path

SHA = "ab" * 32


def _finished_build(out):
    (out / "data").mkdir(parents=True)
    for i, name in enumerate(SNAPSHOT_FILES):
        rows = [{"id": f"{name}-{j}", "messages": [{"role": "user", "content": f"q {i} {j}"}]} for j in range(3)]
        (out / "data" / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name in ("prompts", "regenerate"):
        stage_path(out, name).parent.mkdir(parents=True, exist_ok=True)
        stage_path(out, name).write_text(json.dumps({"name": name, "seconds": 1.0}))


def test_a_snapshot_seeds_a_new_build_with_the_same_files_and_stage_records(tmp_path):
    recipe = load_recipe("smollm2/build")
    _finished_build(tmp_path / "a")
    record = write_snapshot(tmp_path / "a", tmp_path / "snap", recipe, SHA)
    assert {name: f["rows"] for name, f in record["files"].items()} == {name: 3 for name in SNAPSHOT_FILES}
    first = (tmp_path / "snap" / "magpie.jsonl.gz").read_bytes()
    write_snapshot(tmp_path / "a", tmp_path / "snap", recipe, SHA)
    assert (tmp_path / "snap" / "magpie.jsonl.gz").read_bytes() == first  # byte-stable

    seed_from_snapshot(tmp_path / "snap", tmp_path / "b", recipe, SHA, log=lambda _: None)
    for name in SNAPSHOT_FILES:
        assert (tmp_path / "b" / "data" / name).read_bytes() == (tmp_path / "a" / "data" / name).read_bytes()
    fragment = json.loads(stage_path(tmp_path / "b", "regenerate").read_text())
    assert fragment["name"] == "regenerate" and fragment["from_snapshot"] == str(tmp_path / "snap")
    assert not stage_path(tmp_path / "b", "decontaminate").exists()  # rebuilt from the prompts


def test_a_snapshot_is_refused_for_another_recipe_target_or_damaged_file(tmp_path):
    recipe = load_recipe("smollm2/build")
    _finished_build(tmp_path / "a")
    write_snapshot(tmp_path / "a", tmp_path / "snap", recipe, SHA)
    other = {**recipe, "split": {**recipe["split"], "train": recipe["split"]["train"] + 1}}
    with pytest.raises(ValueError, match=r"other settings of \['split'\]"):
        seed_from_snapshot(tmp_path / "snap", tmp_path / "b", other, SHA)
    with pytest.raises(ValueError, match="by a target with weights sha256"):
        seed_from_snapshot(tmp_path / "snap", tmp_path / "b", recipe, "cd" * 32)
    with gzip.open(tmp_path / "snap" / "train_regenerated.jsonl.gz", "wb") as z:
        z.write(b'{"id": "changed"}\n')
    with pytest.raises(ValueError, match="damaged"):
        seed_from_snapshot(tmp_path / "snap", tmp_path / "b", recipe, SHA)
    assert not (tmp_path / "b" / "data" / "train_regenerated.jsonl").exists()


def test_a_snapshot_needs_the_generation_stages_finished(tmp_path):
    _finished_build(tmp_path / "a")
    stage_path(tmp_path / "a", "regenerate").unlink()
    with pytest.raises(ValueError, match=r"\['regenerate'\] have not finished"):
        write_snapshot(tmp_path / "a", tmp_path / "snap", load_recipe("smollm2/build"), SHA)
