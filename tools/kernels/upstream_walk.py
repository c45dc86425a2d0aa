"""vLLM's in-tree candidate walk, `_selector_walk_kernel` (Model Runner V2's DFlash2 / LiLiCorr
speculator), loaded from vLLM's source files without importing vLLM.

It is the speed anchor for our greedy walk kernel and a parity reference for its choices. The
kernel lives in a module that imports half of vLLM's GPU runner, and the GPU machines the
benchmark runs on have no vLLM, so the two Triton functions it needs are copied out of the
installed vLLM at run time (never vendored into this repository):

    python -m tools.kernels.upstream_walk export DIR   # where vLLM is installed
    python -m tools.kernels.bench --upstream-walk DIR  # anywhere with triton

`export` writes DIR/_upstream_gumbel.py (vLLM's gumbel.py with its one vLLM import replaced by
plain triton imports) and DIR/_upstream_selector_walk.py (the kernel's source, cut out with
`ast`), plus DIR/SOURCE.txt naming the vLLM version and files. Triton needs kernels to live in
real files (it reads their source), hence files rather than exec'd strings.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from vllm_liliprop.versions import installed_vllm

SPECULATOR_FILE = "v1/worker/gpu/spec_decode/dflash2/speculator.py"
GUMBEL_FILE = "v1/worker/gpu/sample/gumbel.py"
KERNEL_NAME = "_selector_walk_kernel"
VLLM_TRITON_IMPORT = "from vllm.triton_utils import tl, triton"
PLAIN_TRITON_IMPORT = "import triton\nimport triton.language as tl"
GUMBEL_MODULE = "_upstream_gumbel"
WALK_MODULE = "_upstream_selector_walk"


def installed_vllm_root() -> Path:
    """The installed vllm package folder, found without importing vllm."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("vllm is not installed here; export the walk where it is")
    return Path(spec.origin).parent


def _vllm_version() -> str:
    vllm = installed_vllm()
    return "==".join(vllm) if vllm else "unknown"


def _function_source(source: str, name: str) -> str:
    """The source of top-level function `name`, decorators included."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            lines = source.splitlines()[first - 1 : node.end_lineno]
            return "\n".join(lines) + "\n"
    raise ValueError(f"{name} not found; this vLLM no longer has the DFlash2 selector walk")


def export(out_dir: Path, vllm_root: Path | None = None) -> Path:
    """Write the two kernel files into out_dir (created); returns out_dir."""
    root = vllm_root or installed_vllm_root()
    gumbel = (root / GUMBEL_FILE).read_text()
    if VLLM_TRITON_IMPORT not in gumbel:
        raise ValueError(f"{root / GUMBEL_FILE} no longer imports triton as expected")
    kernel = _function_source((root / SPECULATOR_FILE).read_text(), KERNEL_NAME)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{GUMBEL_MODULE}.py").write_text(
        gumbel.replace(VLLM_TRITON_IMPORT, PLAIN_TRITON_IMPORT)
    )
    (out_dir / f"{WALK_MODULE}.py").write_text(
        f"# {KERNEL_NAME} from vllm/{SPECULATOR_FILE} ({_vllm_version()}), Apache-2.0.\n"
        f"{PLAIN_TRITON_IMPORT}\n\nfrom {GUMBEL_MODULE} import gumbel_noised_argmax\n\n\n{kernel}"
    )
    (out_dir / "SOURCE.txt").write_text(
        f"{_vllm_version()}\nvllm/{GUMBEL_FILE}\nvllm/{SPECULATOR_FILE}:{KERNEL_NAME}\n"
    )
    return out_dir


def _import_file(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the walk module imports the gumbel one by this name
    spec.loader.exec_module(module)
    return module


def load_kernel(source_dir: Path):
    """vLLM's `_selector_walk_kernel` from an `export`ed folder."""
    for name in (GUMBEL_MODULE, WALK_MODULE):
        if not (source_dir / f"{name}.py").exists():
            raise FileNotFoundError(
                f"{source_dir / name}.py is missing; run `python -m "
                f"tools.kernels.upstream_walk export {source_dir}` where vLLM is installed"
            )
    _import_file(GUMBEL_MODULE, source_dir / f"{GUMBEL_MODULE}.py")
    return getattr(_import_file(WALK_MODULE, source_dir / f"{WALK_MODULE}.py"), KERNEL_NAME)


def greedy_walk_fn(kernel) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """fn(start [B, K], pairs [B, S-1, K, K]) -> path [B, S] int64, via vLLM's kernel.

    vLLM's kernel reads one [B, S, K, K] score tensor whose step 0 uses row 0 (there is no
    previous pick yet), so start goes to scores[:, 0, 0] and pairs to scores[:, 1:]. Candidate
    ids are 0..K-1, which makes its tokens our candidate indices. Buffers are built once per
    shape and reused, as a serving loop would; the copy into them is part of each call.
    """
    import triton

    buffers: dict[tuple, dict[str, torch.Tensor]] = {}

    def prepare(batch, num_slots, k, device):
        return dict(
            scores=torch.zeros(batch, num_slots, k, k, dtype=torch.float32, device=device),
            candidates=torch.arange(k, device=device).expand(batch, num_slots, k).contiguous(),
            sample_pos=torch.ones(batch * num_slots, dtype=torch.int64, device=device),
            idx_mapping=torch.arange(batch, dtype=torch.int32, device=device).repeat_interleave(num_slots),
            temperature=torch.zeros(batch, dtype=torch.float32, device=device),
            seeds=torch.zeros(batch, dtype=torch.int64, device=device),
            tokens=torch.empty(batch * num_slots, dtype=torch.int64, device=device),
            realized=torch.empty(batch, num_slots, k, dtype=torch.float32, device=device),
        )

    def walk(start: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
        batch, k = start.shape
        num_slots = pairs.shape[1] + 1
        key = (batch, num_slots, k, start.device)
        if key not in buffers:
            buffers[key] = prepare(batch, num_slots, k, start.device)
        buf = buffers[key]
        buf["scores"][:, 0, 0] = start
        buf["scores"][:, 1:] = pairs
        kernel[(batch,)](
            buf["scores"], buf["candidates"], buf["sample_pos"], buf["idx_mapping"],
            buf["temperature"], buf["seeds"], buf["tokens"], buf["realized"],
            num_steps=num_slots, top_k=k, BLOCK_K=triton.next_power_of_2(k),
            SAMPLE_PROBABILISTIC=False, USE_FP64=False, num_warps=1,
        )
        return buf["tokens"].view(batch, num_slots)

    return walk


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    export_parser = sub.add_parser("export", help="copy the kernel out of the installed vLLM")
    export_parser.add_argument("out_dir", type=Path)
    args = parser.parse_args(argv)
    out = export(args.out_dir)
    print(f"wrote {out}: {(out / 'SOURCE.txt').read_text().splitlines()[0]}")


if __name__ == "__main__":
    main()
