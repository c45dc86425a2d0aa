"""The GPU check script (python -m tools.kernels.device_check) runs clean here too.

On CPU under the interpreter it exercises its comparison logic at small shapes, so the script
is known to work before a GPU session spends device time on it.
"""

import re

import pytest

pytest.importorskip("triton")

from tools.kernels import device_check  # noqa: E402
from tools.kernels.cases import kernel_cases  # noqa: E402
from vllm_liliprop.kernels import triton_dels  # noqa: E402


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_device_check_quick_passes_on_cpu(capsys):
    assert device_check.main(["--quick", "--device", "cpu"]) == 0
    output = capsys.readouterr().out
    checked = re.findall(r"^ok\s+(\S+)\s+batch\s+(\d+)", output, re.MULTILINE)
    names = [case.name for case in kernel_cases(15, 8, 1000, "cpu")]
    assert sorted(checked) == sorted((name, batch) for name in names for batch in ("1", "3"))
    assert "all checks passed" in output


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_device_check_fails_on_a_wrong_kernel(capsys, monkeypatch):
    """The negative control: a kernel that disagrees with its reference fails the check."""
    monkeypatch.setattr(triton_dels, "dels_argmax", lambda long, *args: long.argmin(dim=-1))
    assert device_check.main(["--quick", "--device", "cpu"]) == 1
    output = capsys.readouterr().out
    assert re.search(r"^FAIL dels_argmax\s+batch\s+1", output, re.MULTILINE), output
    assert "2 failures" in output
