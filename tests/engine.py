"""Helpers to run real vLLM engines on the tiny fixtures and collect ids and counters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

PROMPTS = [
    "def foo(x):\n    return",
    "import os\nimport",
    "class A:\n    def",
    "for i in range(",
    "# comment\nx = [",
]
ENGINE_FLAGS = dict(dtype="float32", max_model_len=512, enforce_eager=True, disable_log_stats=False)


@contextmanager
def liliprop_env(options: dict | None):
    """Set VLLM_LILIPROP_OPTIONS for one engine, restoring the old value afterwards."""
    old = os.environ.get("VLLM_LILIPROP_OPTIONS")
    if options is None:
        os.environ.pop("VLLM_LILIPROP_OPTIONS", None)
    else:
        os.environ["VLLM_LILIPROP_OPTIONS"] = json.dumps(options)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("VLLM_LILIPROP_OPTIONS", None)
        else:
            os.environ["VLLM_LILIPROP_OPTIONS"] = old


def generate(target, draft=None, num_spec=7, options=None, prompts=PROMPTS, max_tokens=32,
             temperature=0.0, n=1, seed=None, extra_flags=None, spec_extra=None):
    """(token id lists, SpecDecodeCounters, drafter) of one fresh in-process engine."""
    from vllm import LLM, SamplingParams

    from vllm_liliprop.vllm.metrics import SpecDecodeCounters

    flags = dict(ENGINE_FLAGS, **(extra_flags or {}))
    if draft is not None:
        flags["speculative_config"] = {
            "method": "dflash", "model": str(draft), "num_speculative_tokens": num_spec,
            **(spec_extra or {}),
        }
    with liliprop_env(options):
        llm = LLM(model=str(target), **flags)
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens,
                                ignore_eos=True, n=n, seed=seed)
        outputs = llm.generate(prompts, params, use_tqdm=False)
    ids = [[list(c.token_ids) for c in o.outputs] if n > 1 else list(o.outputs[0].token_ids)
           for o in outputs]
    counters = SpecDecodeCounters.read(llm)
    drafter = find_drafter(llm)
    del llm
    return ids, counters, drafter


def find_drafter(llm):
    """The in-process model runner's drafter (None in multiprocess mode)."""
    try:
        return llm.llm_engine.model_executor.driver_worker.worker.model_runner.drafter
    except AttributeError:
        return None


def run_in_subprocess(code: str, env_overrides: dict[str, str], timeout: int = 600) -> dict:
    """Run python code that prints one JSON line starting with RESULT=; return it parsed."""
    env = dict(os.environ, **env_overrides)
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=root)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT="):
            return json.loads(line[len("RESULT="):])
    raise AssertionError(f"subprocess failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
