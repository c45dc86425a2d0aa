"""The drafter's own weight files, checked before vLLM's loader reads them, and vLLM's loader
errors explained in terms of those files.

vLLM reads a draft folder's safetensors itself; its errors name neither the file nor the tensor
(a truncated file: `SafetensorError: Error while deserializing header: ...`; a tensor of the
wrong shape: `AssertionError: Tried to load weights of size torch.Size([33, 128])to a parameter
of size torch.Size([32, 128])`). Reading every header first costs a few milliseconds (no tensor
data is read) and turns the first into a message naming the file; the second is explained
after the fact by the checkpoint tensors whose shape vLLM quotes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from safetensors import SafetensorError, safe_open

REEXPORT = "copy the draft folder again or re-export the draft (python -m training.export)"
_SHAPE_ERROR = re.compile(r"weights of size torch\.Size\(\[([\d, ]*)\]\)\s*to a parameter of "
                          r"size torch\.Size\(\[([\d, ]*)\]\)")


def weight_files(draft_dir: Path) -> list[Path]:
    """The safetensors files a draft folder holds: those its index names (each must exist), or
    every `*.safetensors` in it."""
    index = draft_dir / "model.safetensors.index.json"
    if not index.is_file():
        return sorted(draft_dir.glob("*.safetensors"))
    try:
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{index} is not a safetensors index (a JSON object with a "
                         f"'weight_map'): {exc!r}; {REEXPORT}") from None
    missing = [name for name in names if not (draft_dir / name).is_file()]
    if missing:
        raise ValueError(f"{index} names {missing}, which {'is' if len(missing) == 1 else 'are'} "
                         f"missing from {draft_dir}; {REEXPORT}")
    return [draft_dir / name for name in names]


def tensor_shapes(draft_dir: Path) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} over the draft's weight files, read from the headers only. A file
    that is not readable safetensors (truncated, damaged, not safetensors at all) raises a
    ValueError naming it."""
    shapes: dict[str, tuple[int, ...]] = {}
    for path in weight_files(draft_dir):
        try:
            with safe_open(str(path), "pt") as f:
                for name in f.keys():
                    shapes[name] = tuple(f.get_slice(name).get_shape())
        except (SafetensorError, OSError) as exc:
            raise ValueError(f"{path} cannot be read as safetensors ({exc}); the file is "
                             f"truncated or damaged: {REEXPORT}") from None
    return shapes


def explain_load_error(draft_dir: Path, error: BaseException) -> str | None:
    """What vLLM's loader error means for this draft folder, naming the tensors, or None when
    the error is not one this module recognises (it is then left as vLLM raised it)."""
    match = _SHAPE_ERROR.search(str(error))
    if match is None:
        return None
    found, wanted = (tuple(int(d) for d in m.split(",") if d.strip()) for m in match.groups())
    names = sorted(n for n, shape in tensor_shapes(draft_dir).items() if shape == found)
    which = f" ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''})" if names else ""
    return (f"{draft_dir}: a checkpoint tensor of shape {found}{which} is loaded into a "
            f"parameter of shape {wanted} of the model that config.json describes; config.json "
            f"and the weights disagree: {REEXPORT}")
