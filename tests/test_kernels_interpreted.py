"""Entry point for the Triton kernel tests from a plain `pytest tests` run.

tests/kernels needs TRITON_INTERPRET=1 before triton is imported, so it runs here in a
subprocess. The other tests check the CPU side of vllm_liliprop.kernels (the dispatchers never
import triton, the benchmark runs without a GPU) and, where a CUDA device exists, run the real
kernels through tools.kernels.device_check.
"""

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


def _run(args, env_updates=None, drop=("TRITON_INTERPRET",), timeout=900):
    env = {key: value for key, value in os.environ.items() if key not in drop}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(env_updates or {})
    return subprocess.run(
        [sys.executable, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


@needs_triton
@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1", reason="TRITON_INTERPRET=1 already collects tests/kernels directly"
)
def test_interpreted_kernel_suite():
    result = _run(
        ["-m", "pytest", "tests/kernels", "-q", "-p", "no:cacheprovider"],
        env_updates={"TRITON_INTERPRET": "1"},
        drop=(),
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    passed = re.search(r"(\d+) passed", output)
    assert passed and int(passed.group(1)) > 0, output[-2000:]


CPU_DISPATCH_SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    import vllm_liliprop.kernels as kernels
    from vllm_liliprop import walks
    from vllm_liliprop.heads.candidates import topk_candidates
    from vllm_liliprop.kernels import reference

    triton_before = "triton" in sys.modules
    g = torch.Generator().manual_seed(0)
    logits, short = torch.randn(6, 300, generator=g), torch.randn(6, 300, generator=g)
    log_prior = torch.log_softmax(torch.randn(300, generator=g), 0)
    start, pairs = torch.randn(3, 8, generator=g), torch.randn(3, 14, 8, 8, generator=g)
    alpha = torch.rand(6, generator=g)

    pairs_equal = lambda a, b: all(torch.equal(x, y) for x, y in zip(a, b))
    checks = {
        "topk_candidates": pairs_equal(kernels.topk_candidates(logits, 8), topk_candidates(logits, 8)),
        "greedy_walk": torch.equal(kernels.greedy_walk(start, pairs), walks.greedy_walk(start, pairs)),
        "viterbi_walk": torch.equal(kernels.viterbi_walk(start, pairs), walks.viterbi_walk(start, pairs)),
        "dels_argmax": torch.equal(
            kernels.dels_argmax(logits, short, log_prior, alpha, 0.3),
            reference.dels_argmax(logits, short, log_prior, alpha, 0.3),
        ),
    }
    ours = sorted(name for name in sys.modules if name.startswith("vllm_liliprop.kernels.triton"))
    print("checks", checks)
    print("kernel modules imported", ours)
    print("triton imported before", triton_before, "after", "triton" in sys.modules)
    assert all(checks.values()), checks
    assert not ours, ours
    assert triton_before or "triton" not in sys.modules, "a CPU dispatch imported triton"
    """
)


def test_cpu_dispatch_never_imports_triton():
    result = _run(["-c", CPU_DISPATCH_SCRIPT], timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "after False" in result.stdout or "before True" in result.stdout


@needs_triton
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_triton_kernels_on_cuda_match_references_and_capture_in_graphs():
    result = _run(["-m", "tools.kernels.device_check"], timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    assert "all checks passed" in result.stdout


def test_bench_quick_runs_the_torch_paths_on_cpu():
    result = _run(["-m", "tools.kernels.bench", "--quick"], timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    if "cuda" not in output.split("device=")[1].split()[0]:
        assert "require a CUDA device" in output
    for name in ("topk_candidates", "greedy_walk", "viterbi_walk", "dels_argmax"):
        assert re.search(rf"^{name}\n", output, re.MULTILINE), name
    timed_rows = re.findall(r"^\s+(1|8)\s+\S+\s+(\d+\.\d+)", output, re.MULTILINE)
    assert len(timed_rows) == 8, output
