"""Every kernel lowers to a Hopper (sm_90) binary, checked on a CPU machine.

The interpreter runs the kernels' Python semantics only; compiling through Triton's real
backend (with the ptxas Triton ships) catches constructs the GPU compiler rejects.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

from vllm_liliprop.kernels import triton_dels, triton_topk, triton_walks  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_all_kernels_compile_for_sm90(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # compile for real, not from an earlier run's cache
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns when unset
    result = subprocess.run(
        [sys.executable, "-m", "tools.kernels.cross_compile", "--arch", "90"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    compiled = [line for line in result.stdout.splitlines() if line.startswith("sm_90 ")]
    assert f"compiled {len(compiled)} kernel specs for sm_90" in result.stdout
    assert all("registers" in line for line in compiled), result.stdout
    # Every kernel of the runtime has a spec: a new kernel without one fails here.
    assert {line.split()[1] for line in compiled} == _runtime_kernels(), result.stdout


def _runtime_kernels() -> set[str]:
    return {name for module in (triton_dels, triton_topk, triton_walks)
            for name, value in vars(module).items()
            if isinstance(value, triton.runtime.jit.KernelInterface) and name.endswith("_kernel")}
