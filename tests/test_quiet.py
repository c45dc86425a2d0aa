"""Quiet by default (vllm_liliprop/quiet.py): libraries at WARNING, --verbose / LILIPROP_VERBOSE
to see everything; a tiny `python -m eval run` prints no vLLM INFO line."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_liliprop import quiet

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "testbed" / "tiny"


@pytest.fixture
def clean_env(monkeypatch):
    for name in list(quiet.QUIET_ENV) + [quiet.VERBOSE_ENV]:
        monkeypatch.delenv(name, raising=False)


def test_quiet_sets_warning_levels_but_an_explicit_setting_wins(clean_env, monkeypatch):
    import warnings

    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")
    with warnings.catch_warnings():
        quiet.quiet(verbose=False)
        assert os.environ["VLLM_LOGGING_LEVEL"] == "WARNING"
        assert os.environ["TRANSFORMERS_VERBOSITY"] == "info"
        with warnings.catch_warnings(record=True) as caught:
            warnings.warn("old API", FutureWarning)
        assert caught == []


def test_verbose_leaves_the_libraries_alone_and_tells_child_processes(clean_env):
    assert quiet.verbose_requested(["run", "--verbose"]) and not quiet.verbose_requested(["run"])
    quiet.quiet(verbose=True)
    assert "VLLM_LOGGING_LEVEL" not in os.environ and os.environ[quiet.VERBOSE_ENV] == "1"
    assert quiet.verbose_requested([]) and quiet.load_progress()


@pytest.mark.vllm
@pytest.mark.slow
def test_a_tiny_eval_run_prints_no_vllm_info_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_LOGGING_LEVEL", quiet.VERBOSE_ENV)}
    env.update(PYTHONPATH=str(REPO), VLLM_ENABLE_V1_MULTIPROCESSING="0")
    command = [sys.executable, "-m", "eval", "run", "--target", str(TINY / "target"),
               "--systems", str(TINY / "systems.json"), "--var", f"testbed={TINY}", "--only", "AR",
               "--benchmarks", "testbed-code", "--data-dir", str(TINY / "eval"), "--limit", "1",
               "--temperatures", "0", "--max-tokens", "8",
               "--engine-flags", '{"max_model_len": 512, "enforce_eager": true}',
               "--results", str(tmp_path / "r.csv")]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    info = [line for line in done.stdout.splitlines() if re.search(r"\bINFO\b", line)]
    assert info == []
    assert "eval run " in done.stdout and "| testbed-code |" in done.stdout  # our own lines stay
    assert "Loading safetensors checkpoint shards" not in done.stderr
    assert "FutureWarning" not in done.stderr


@pytest.mark.vllm
@pytest.mark.slow
def test_with_a_log_file_the_console_keeps_only_our_lines(tmp_path):
    """LILIPROP_LOG (the main job's): vLLM's warnings and INFO lines land in the file, none on
    the console, whose lines are all our own (run line, progress bar, table)."""
    log = tmp_path / "main_job.log"
    env = {k: v for k, v in os.environ.items()
           if k not in ("VLLM_LOGGING_LEVEL", "VLLM_LOGGING_CONFIG_PATH", quiet.VERBOSE_ENV)}
    env.update(PYTHONPATH=str(REPO), VLLM_ENABLE_V1_MULTIPROCESSING="0", LILIPROP_LOG=str(log))
    command = [sys.executable, "-m", "eval", "run", "--target", str(TINY / "target"),
               "--systems", str(TINY / "systems.json"), "--var", f"testbed={TINY}", "--only", "AR",
               "--benchmarks", "testbed-code", "--data-dir", str(TINY / "eval"), "--limit", "1",
               "--temperatures", "0", "--max-tokens", "8", "--no-progress",
               "--engine-flags", '{"max_model_len": 512, "enforce_eager": true}',
               "--results", str(tmp_path / "r.csv")]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    console = done.stdout + done.stderr
    assert not re.search(r"\b(WARNING|INFO)\b", console), console[-3000:]
    assert "eval run " in done.stdout and "| testbed-code |" in done.stdout
    written = log.read_text()
    assert re.search(r" WARNING vllm", written) and re.search(r" INFO vllm", written)
