"""Resumable pipeline stages: a stage runs once, and its manifest fragment says it is done.

A stage is a function returning a JSON-able dict (counts, metrics, paths). `run_stage` stores that
dict as `OUT/stages/<name>.json` with the stage's wall time, and on a later call with the same
name returns the stored dict without running the function: a rerun of a pipeline skips every
finished stage, and an interrupted stage (no fragment yet) runs again, picking up whatever partial
output it resumes from itself (appended JSONL, trainer checkpoints).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

STAGE_DIR = "stages"


def stage_path(out: Path, name: str) -> Path:
    return Path(out) / STAGE_DIR / f"{name}.json"


def run_stage(out: Path, name: str, fn: Callable[[], dict], log=print) -> dict:
    path = stage_path(out, name)
    if path.is_file():
        fragment = json.loads(path.read_text())
        log(f"[{name}] done earlier ({fragment.get('seconds', '?')} s), skipped")
        return fragment
    log(f"[{name}] running")
    began = time.perf_counter()
    fragment = dict(fn())
    fragment["seconds"] = round(time.perf_counter() - began, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(fragment, indent=2) + "\n")
    tmp.replace(path)
    log(f"[{name}] done in {fragment['seconds']} s")
    return fragment


def finished_stages(out: Path) -> dict[str, dict]:
    folder = Path(out) / STAGE_DIR
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}
