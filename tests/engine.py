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
             temperature=0.0, n=1, seed=None, extra_flags=None, spec_extra=None, seeds=None,
             metrics_out=None, prepare=None):
    """(token id lists, SpecDecodeCounters, drafter) of one fresh in-process engine.

    seeds: one sampling seed per prompt (overrides seed). metrics_out: a dict that receives every
    scalar metric of the engine by name. prepare: called with the drafter once the engine has
    loaded, before generating (a test breaks a head there, as a bad weight would at run time)."""
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
        if prepare is not None:
            prepare(find_drafter(llm))

        def params(s):
            return SamplingParams(temperature=temperature, max_tokens=max_tokens,
                                  ignore_eos=True, n=n, seed=s)

        sampling = [params(s) for s in seeds] if seeds is not None else params(seed)
        outputs = llm.generate(prompts, sampling, use_tqdm=False)
    ids = [[list(c.token_ids) for c in o.outputs] if n > 1 else list(o.outputs[0].token_ids)
           for o in outputs]
    metrics = llm.get_metrics()
    counters = SpecDecodeCounters.from_metrics(metrics)
    if metrics_out is not None:
        metrics_out.update({m.name: m.value for m in metrics if hasattr(m, "value")})
    drafter = find_drafter(llm)
    del llm
    return ids, counters, drafter


def recording(records: list):
    """A `generate(prepare=...)` hook keeping what the live rule saw and drafted at each step."""
    def prepare(drafter):
        rule = drafter.draft_rule
        real = rule.propose

        def propose(inputs):
            output = real(inputs)
            records.append({"hidden": inputs.hidden.clone(), "anchor": inputs.anchor_ids.clone(),
                            "ids": output.token_ids.clone(), "faulty": _copy(output.faulty_rows),
                            "argmax": _copy(output.fallback_ids)})
            return output

        rule.propose = propose
    return prepare


def _copy(tensor):
    return None if tensor is None else tensor.clone()


def changed_fraction(records) -> float:
    """The fraction of drafted slots where the rule's draft is not the drafter's argmax."""
    changed = sum(int((step["ids"] != step["argmax"]).sum()) for step in records)
    return changed / sum(step["ids"].numel() for step in records)


def find_drafter(llm):
    """The in-process model runner's drafter (None in multiprocess mode)."""
    from vllm_liliprop.vllm.offline import in_process_drafter

    return in_process_drafter(llm)


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


def predict_counters(outputs, draft_fn, k, max_tokens=32):
    """Spec-decode counters predicted from plain greedy outputs for a known draft policy.

    draft_fn(ys, p) -> up to k draft tokens given the output so far ys[: p + 1] (ys[p] is the
    last verified token; fewer than k: a draft cut short, none: a plain step). After prefill
    the first output token is verified; each step accepts the leading drafts that match the
    target's own continuation and adds one bonus token, until max_tokens are out. The last
    step's drafts are verified past max_tokens (the surplus is dropped afterwards), so
    `outputs` must run k tokens longer than max_tokens."""
    drafts = drafted = accepted = 0
    per_pos = [0] * k
    for ys in outputs:
        assert len(ys) >= max_tokens + k
        p = 0
        while p < max_tokens - 1:
            proposal = list(draft_fn(ys, p))[:k]
            a = 0
            while a < len(proposal) and ys[p + 1 + a] == proposal[a]:
                a += 1
            drafts += bool(proposal)
            drafted += len(proposal)
            accepted += a
            for i in range(a):
                per_pos[i] += 1
            p += a + 1
    return [drafts, drafted, accepted, per_pos]


def counters_list(c):
    return [c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens, list(c.accepted_per_pos)]


def plain32(stock):
    """The plain greedy outputs cut to the 32 tokens the speculative runs generate."""
    return [ys[:32] for ys in stock["plain"]["ids"]]


def unused_tokens(outputs, vocab_size, count, skip=4):
    """`count` token ids that never occur in `outputs` (avoiding the first special ids)."""
    seen = {t for ys in outputs for t in ys}
    return [t for t in range(skip, vocab_size) if t not in seen][:count]


def most_common_token(outputs):
    from collections import Counter

    return Counter(t for ys in outputs for t in ys).most_common(1)[0][0]


def error_chain(error: BaseException) -> str:
    """An engine-start failure with its causes, one per line (vLLM wraps a loader's error)."""
    chain, exc = [], error
    while exc is not None:
        chain.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return "\n".join(chain)
