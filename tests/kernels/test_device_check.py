"""The GPU check script (python -m tools.kernels.device_check) runs clean here too.

On CPU under the interpreter it exercises its comparison logic at small shapes, so the script
is known to work before a GPU session spends device time on it.
"""

import pytest

pytest.importorskip("triton")

from tools.kernels import device_check  # noqa: E402


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_device_check_quick_passes_on_cpu(capsys):
    assert device_check.main(["--quick", "--device", "cpu"]) == 0
    output = capsys.readouterr().out
    assert "all checks passed" in output and output.count("ok ") == 10
