"""Domino's correction head (LiLiCorr App. A; DeLS-Spec related work), as this package defines it:
a recurrent cell over the drafter's width run slot by slot on the previously drafted token, and a
low-rank residual on the drafter's logits,

    g_s        = GRUCell(E[prev_s], g_{s-1}),   g_{-1} = 0
    residual_s = up(silu(down(g_s + hidden_s)))

E is the target's (frozen) input embedding table, prev_s the token committed before slot s (the
anchor for slot 0), hidden_s the drafter's final-normed state at slot s: the cell carries the
drafted prefix, the drafter's state carries the long context. `up` covers `vocab_ids`, the ids
the head was trained to score (the draft vocabulary), and starts at zero, so a head trained on
a finished drafter starts at its loss. Sequential-head protocol: heads/sequential.py.

Folder format (an additive extension, like DeLS's; `domino/` inside a DFlash draft directory):
  config.json        {"liliprop_domino_format": 1, "vocab_size": V, "embed_size": E,
                      "hidden_size": H, "rank": r}
  model.safetensors  cell.weight_ih [3H, E], cell.weight_hh [3H, H], cell.bias_ih [3H],
                     cell.bias_hh [3H], down.weight [r, H], up.weight [n, r],
                     vocab_ids [n] int64 (ascending target ids)
The draft's config.json names the rule: dflash_config.liliprop = {"rule": "domino"}.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from vllm_liliprop.faults import check_loaded_weights

DOMINO_FORMAT_VERSION = 1
DOMINO_SUBFOLDER = "domino"
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


@dataclass(frozen=True)
class DominoConfig:
    vocab_size: int
    embed_size: int
    hidden_size: int
    rank: int
    liliprop_domino_format: int = DOMINO_FORMAT_VERSION

    def __post_init__(self):
        if self.liliprop_domino_format != DOMINO_FORMAT_VERSION:
            raise ValueError(f"liliprop_domino_format={self.liliprop_domino_format!r} is not supported "
                             f"(this reader knows {DOMINO_FORMAT_VERSION}); upgrade vllm-liliprop")
        for name in ("vocab_size", "embed_size", "hidden_size", "rank"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ValueError(f"Domino config.{name} must be a positive integer, got "
                                 f"{getattr(self, name)!r}")


class DominoHead(nn.Module):
    def __init__(self, config: DominoConfig, embed_weight: torch.Tensor, vocab_ids: torch.Tensor):
        super().__init__()
        if tuple(embed_weight.shape) != (config.vocab_size, config.embed_size):
            raise ValueError(f"embed_weight is {tuple(embed_weight.shape)}; the Domino head needs the "
                             f"target's input embedding [vocab_size, embed_size] = "
                             f"{(config.vocab_size, config.embed_size)}")
        vocab_ids = torch.as_tensor(vocab_ids, dtype=torch.int64)
        if vocab_ids.dim() != 1 or vocab_ids.numel() == 0 or bool((vocab_ids[1:] <= vocab_ids[:-1]).any()) \
                or int(vocab_ids[0]) < 0 or int(vocab_ids[-1]) >= config.vocab_size:
            raise ValueError("Domino vocab_ids must be strictly increasing target ids in "
                             f"[0, {config.vocab_size})")
        self.config = config
        self.cell = nn.GRUCell(config.embed_size, config.hidden_size)
        self.down = nn.Linear(config.hidden_size, config.rank, bias=False)
        self.up = nn.Linear(config.rank, vocab_ids.numel(), bias=False)
        nn.init.zeros_(self.up.weight)
        self.register_buffer("vocab_ids", vocab_ids.to(embed_weight.device), persistent=False)
        # The target's table, shared: not a buffer, so `.to(dtype)` never copies it.
        self.embed_weight = embed_weight.detach()

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embed_weight).to(self.cell.weight_ih.dtype)

    def _residual(self, cell_state: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return self.up(F.silu(self.down(cell_state + hidden.to(cell_state.dtype))))

    def init_state(self, batch: int, device=None) -> torch.Tensor:
        weight = self.cell.weight_hh
        return torch.zeros(batch, self.config.hidden_size, device=device or weight.device,
                           dtype=weight.dtype)

    def step(self, state: torch.Tensor, prev_ids: torch.Tensor, hidden: torch.Tensor):
        state = self.cell(self._embed(prev_ids), state.to(self.cell.weight_hh.dtype))
        return self._residual(state, hidden), state

    def teacher_forced(self, prev_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        embedded = self._embed(prev_ids)
        state = self.init_state(prev_ids.shape[0], prev_ids.device).to(embedded.dtype)
        states = []
        for slot in range(prev_ids.shape[1]):
            state = self.cell(embedded[:, slot], state)
            states.append(state)
        return self._residual(torch.stack(states, dim=1), hidden)

    def restricted_to(self, ids: torch.Tensor) -> torch.Tensor:
        """up.weight rows for target ids `ids` [N] (zero rows for ids the head never scored): the
        projection a draft vocabulary other than the head's own needs."""
        position = torch.full((self.config.vocab_size,), -1, dtype=torch.long, device=self.vocab_ids.device)
        position[self.vocab_ids] = torch.arange(self.vocab_ids.numel(), device=self.vocab_ids.device)
        rows = position[ids.to(position.device).long()]
        weight = self.up.weight[rows.clamp(min=0)]
        return torch.where((rows >= 0)[:, None], weight, torch.zeros_like(weight))


def save_domino_head(folder: str | Path, head: DominoHead, dtype: torch.dtype = torch.bfloat16) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to("cpu", dtype).contiguous() for name, t in head.state_dict().items()}
    tensors["vocab_ids"] = head.vocab_ids.detach().cpu().contiguous()
    save_file(tensors, str(folder / WEIGHTS_NAME), metadata={"liliprop_domino_format": str(DOMINO_FORMAT_VERSION)})
    (folder / CONFIG_NAME).write_text(json.dumps(asdict(head.config), indent=2) + "\n")
    return folder


def find_domino_dir(path: str | Path) -> Path:
    """`path` itself when it holds a Domino config, else `path/domino`."""
    path = Path(path)
    for folder in (path, path / DOMINO_SUBFOLDER):
        config = folder / CONFIG_NAME
        if config.is_file() and "liliprop_domino_format" in config.read_text():
            return folder
    raise ValueError(f"no Domino head at {path} (nor {path / DOMINO_SUBFOLDER}): a folder with "
                     "config.json (liliprop_domino_format) and model.safetensors, written by "
                     "training.export")


def load_domino_head(path: str | Path, embed_weight: torch.Tensor, *, device=None,
                     dtype: torch.dtype = torch.float32) -> DominoHead:
    """Load and validate a Domino head folder; every mismatch names the field and the fix."""
    folder = find_domino_dir(path)
    try:
        fields = json.loads((folder / CONFIG_NAME).read_text())
        config = DominoConfig(**fields)
    except (json.JSONDecodeError, TypeError) as exc:
        raise ValueError(f"{folder / CONFIG_NAME}: not a valid Domino config ({exc}); re-export "
                         "the head") from None
    weights_path = folder / WEIGHTS_NAME
    if not weights_path.is_file():
        raise ValueError(f"{weights_path} is missing; re-export the Domino head")
    tensors = load_file(str(weights_path))
    if "vocab_ids" not in tensors:
        raise ValueError(f"{weights_path} has no vocab_ids tensor; re-export the Domino head")
    vocab_ids = tensors.pop("vocab_ids")
    check_loaded_weights(tensors, str(weights_path), "the Domino head diverged in training or the "
                         "file is damaged: retrain or re-export it")
    head = DominoHead(config, embed_weight, vocab_ids)
    try:
        head.load_state_dict(tensors, strict=True)
    except RuntimeError as exc:
        raise ValueError(f"{weights_path} does not match its config.json ({exc}); re-export the "
                         "Domino head") from None
    device = embed_weight.device if device is None else device
    return head.to(device=device, dtype=dtype).eval()
