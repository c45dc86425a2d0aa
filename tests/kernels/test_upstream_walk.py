"""vLLM's in-tree `_selector_walk_kernel`, copied out of the installed vLLM, agrees with our
greedy walks (torch reference and Triton kernel) on every lattice, ties included (interpreted).
"""

import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("triton")
pytest.importorskip("vllm")

import triton.runtime.interpreter as interpreter  # noqa: E402

from vllm_liliprop import walks  # noqa: E402
from tools.kernels import upstream_walk
from vllm_liliprop.kernels import triton_walks  # noqa: E402


@pytest.fixture(scope="module")
def vllm_walk(tmp_path_factory):
    return upstream_walk.greedy_walk_fn(upstream_walk.load_kernel(upstream_walk.export(
        tmp_path_factory.mktemp("upstream"))))


@pytest.fixture(autouse=True)
def boolean_masks(monkeypatch):
    """Triton 3's interpreter turns `block_mask & scalar_bool` (vLLM's `mask & valid`) into an
    int32 array that its load/store then reject; compiled Triton keeps it int1. Cast such masks
    back to bool so the unmodified vLLM kernel can be interpreted."""
    load, store = interpreter._interpreter.load, interpreter._interpreter.store
    monkeypatch.setattr(interpreter._interpreter, "load",
                        lambda ptrs, mask, other, dtype: load(ptrs, mask.astype(np.bool_), other, dtype))
    monkeypatch.setattr(interpreter._interpreter, "store",
                        lambda ptrs, value, mask: store(ptrs, value, mask.astype(np.bool_)))


def _lattice(batch, num_slots, k, seed, tied=False):
    generator = torch.Generator().manual_seed(seed)
    if tied:  # scores in {-1, 0, 1}: most steps hold exact ties
        return (torch.randint(-1, 2, (batch, k), generator=generator).float(),
                torch.randint(-1, 2, (batch, num_slots - 1, k, k), generator=generator).float())
    return torch.randn(batch, k, generator=generator), torch.randn(batch, num_slots - 1, k, k, generator=generator)


@pytest.mark.parametrize("batch, num_slots, k, tied", [
    (1, 15, 16, False), (64, 15, 8, False), (64, 1, 16, False), (5, 6, 1, False), (32, 15, 8, True),
])
def test_vllm_walk_picks_what_our_greedy_walks_pick(vllm_walk, batch, num_slots, k, tied):
    start, pairs = _lattice(batch, num_slots, k, seed=batch + num_slots + k, tied=tied)
    expected = walks.greedy_walk(start, pairs)
    assert torch.equal(vllm_walk(start, pairs), expected)
    assert torch.equal(triton_walks.greedy_walk(start, pairs), expected)


def test_export_names_its_source_and_loading_does_not_import_vllm(tmp_path):
    out = upstream_walk.export(tmp_path / "walk")
    source = (out / "SOURCE.txt").read_text()
    assert "0.32" in source and upstream_walk.KERNEL_NAME in source
    code = (f"import sys; from pathlib import Path; from tools.kernels import upstream_walk; "
            f"upstream_walk.load_kernel(Path({str(out)!r})); assert 'vllm' not in sys.modules")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def test_loading_from_an_empty_folder_says_how_to_export(tmp_path):
    with pytest.raises(FileNotFoundError, match="upstream_walk export"):
        upstream_walk.load_kernel(tmp_path)
