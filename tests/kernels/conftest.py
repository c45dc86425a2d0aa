"""Kernel tests run the Triton kernels on CPU tensors through the Triton interpreter.

The interpreter must be chosen before triton is imported, so these files are collected only
when TRITON_INTERPRET=1 is already set; a plain `pytest tests` leaves them to
tests/test_kernels_interpreted.py, which runs this directory in a subprocess with it set.
"""

import os
from pathlib import Path

import pytest

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
if not INTERPRETING:
    collect_ignore_glob = ["test_*.py"]


def pytest_collection_modifyitems(config, items):
    # Files named explicitly on the command line are collected despite collect_ignore_glob.
    if INTERPRETING:
        return
    skip = pytest.mark.skip(reason="set TRITON_INTERPRET=1 before triton is imported "
                                   "(or run tests/test_kernels_interpreted.py)")
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(skip)


class NoLaunch:
    """Stands in for a @triton.jit kernel and fails the test if anything launches it."""

    def __init__(self, name: str):
        self.name = name

    def __getitem__(self, grid):
        raise AssertionError(f"{self.name} was launched for an empty batch")


@pytest.fixture
def forbid_launch(monkeypatch):
    """forbid_launch(module, "kernel_name", ...) replaces those kernels by NoLaunch."""

    def forbid(module, *names):
        for name in names:
            monkeypatch.setattr(module, name, NoLaunch(name))

    return forbid
