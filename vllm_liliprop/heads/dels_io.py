"""On-disk format of a DeLS-Spec short head, and an importer for the public DeLS-Spec release.

A DeLS head lives in its own folder, by convention `dels/` inside a DFlash or LiLiCorr draft
directory (any folder works). The folder holds two files:

config.json (`DelsConfig`):
  liliprop_dels_format  int, 1. Readers reject other values.
  kind                  "gru" | "markov": which short head (`GRUShortHead` / `MarkovShortHead`).
  vocab_size            int V: logits width of the head; must equal the drafter's/target's.
  rank                  int r: low-rank bottleneck width.
  embed_dim             int D (gru): width of the token embedding the GRU reads; null (markov).
  hidden_size           int H (gru): GRU hidden width; null (markov).
  rank_activation       "silu" | "identity" (gru): activation after the rank projection;
                        "silu" is the paper's head, "identity" only for imported public heads.
  embedding_source      "target" | "checkpoint" (gru): "target" means the head reads the target
                        model's input embedding table, which is NOT saved and must be passed to
                        the loader; "checkpoint" means the table is saved as `embed.weight`.
  pure_draft_prefix_len 0 | 1: 0 = every slot is corrected and the short head reads the anchor
                        first (this project's rule); 1 = slot 0 is drafted by the long logits
                        alone and the short prefix starts at the first draft (the public
                        DeLS-Spec runtime, which its released heads were trained for).
  prior_smoothing       float | null: additive smoothing lambda the prior was built with.
  tokenizer_fingerprint str | null: `tokenizer_fingerprint(tokenizer)` of the tokenizer the head
                        and prior were trained with ("sha256:<hex>").
  alpha, beta           number or per-slot list: default fusion weights (0.3 / 0.3). A list
                        entry s is the weight of draft slot s; `DelsConfig.slot_weights`
                        resolves it to the runtime's number of speculative tokens.

model.safetensors:
  head weights under the module names of the head class
    gru:    gru.weight_ih_l0 [3H, D], gru.weight_hh_l0 [3H, H], to_rank.weight [r, H],
            rank_to_vocab.weight [V, r], and embed.weight [V, D] only when
            embedding_source == "checkpoint"
    markov: state_embed.weight [V, r], rank_to_vocab.weight [V, r]
  prior.log_probs fp32 [V]: the unigram log-prior (`UnigramPrior.log_probs`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from vllm_liliprop.faults import check_loaded_weights
from vllm_liliprop.heads.dels import (
    RANK_ACTIVATIONS, GRUShortHead, MarkovShortHead, UnigramPrior, check_fusion_weight,
    slot_weights
)

DELS_FORMAT_VERSION = 1
DELS_SUBFOLDER = "dels"
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
KINDS = ("gru", "markov")
EMBEDDING_SOURCES = ("target", "checkpoint")
PRIOR_KEY = "prior.log_probs"
EMBED_KEY = "embed.weight"


# The fusion weights alpha and beta when a head's config names none (the DeLS-Spec paper's 0.3).
DEFAULT_FUSION_WEIGHT = 0.3


@dataclasses.dataclass
class DelsConfig:
    """config.json of a DeLS head folder; fields documented in the module docstring."""

    kind: str
    vocab_size: int
    rank: int
    embed_dim: int | None = None
    hidden_size: int | None = None
    rank_activation: str = "silu"
    embedding_source: str = "target"
    pure_draft_prefix_len: int = 0
    prior_smoothing: float | None = 1.0
    tokenizer_fingerprint: str | None = None
    alpha: float | list[float] = DEFAULT_FUSION_WEIGHT
    beta: float | list[float] = DEFAULT_FUSION_WEIGHT
    liliprop_dels_format: int = DELS_FORMAT_VERSION

    def __post_init__(self):
        if self.liliprop_dels_format != DELS_FORMAT_VERSION:
            raise ValueError(f"liliprop_dels_format={self.liliprop_dels_format!r} is not supported "
                             f"(this reader knows {DELS_FORMAT_VERSION}); upgrade vllm-liliprop or "
                             "re-export the head")
        if self.kind not in KINDS:
            raise ValueError(f"kind={self.kind!r} is unknown; set kind to one of {KINDS}")
        for name in ("vocab_size", "rank"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"config field {name!r} must be a positive int, got {value!r}")
        if self.kind == "gru":
            for name in ("embed_dim", "hidden_size"):
                value = getattr(self, name)
                if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                    raise ValueError(f"config field {name!r} must be a positive int for kind='gru', "
                                     f"got {value!r}")
            if self.rank_activation not in RANK_ACTIVATIONS:
                raise ValueError(f"rank_activation={self.rank_activation!r}; choose one of {RANK_ACTIVATIONS}")
            if self.embedding_source not in EMBEDDING_SOURCES:
                raise ValueError(f"embedding_source={self.embedding_source!r}; choose one of "
                                 f"{EMBEDDING_SOURCES}")
        if self.pure_draft_prefix_len not in (0, 1):
            raise ValueError(f"pure_draft_prefix_len={self.pure_draft_prefix_len!r} must be 0 or 1")
        self.alpha = check_fusion_weight(self.alpha, "config field 'alpha'")
        self.beta = check_fusion_weight(self.beta, "config field 'beta'")

    @classmethod
    def for_head(cls, head: GRUShortHead | MarkovShortHead, prior: UnigramPrior,
                 **fields) -> "DelsConfig":
        """The structural fields read off `head` and `prior`; other fields from **fields."""
        return cls(**{**head_structure(head), "prior_smoothing": prior.smoothing, **fields})

    @classmethod
    def from_dict(cls, data: Mapping) -> "DelsConfig":
        if not isinstance(data, Mapping):
            raise ValueError(f"a DeLS config must be a JSON object, got {type(data).__name__}; "
                             "write it with save_dels_head")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown DeLS config fields {unknown}; the known fields are {sorted(known)}")
        if "liliprop_dels_format" not in data:
            raise ValueError("config field 'liliprop_dels_format' is missing; this is not a DeLS "
                             "head config (write it with save_dels_head)")
        missing = [name for name in ("kind", "vocab_size", "rank") if name not in data]
        if missing:
            raise ValueError(f"DeLS config is missing required fields {missing}")
        return cls(**data)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def slot_weights(self, name: str, num_slots: int) -> list[float]:
        """Resolve `alpha` or `beta` to `num_slots` per-slot weights. A longer list (trained for
        a larger block) is cut to its first num_slots entries; a shorter one is an error."""
        if name not in ("alpha", "beta"):
            raise ValueError(f"name={name!r} must be 'alpha' or 'beta'")
        return slot_weights(getattr(self, name), num_slots, f"config field {name!r}")


def head_structure(head: GRUShortHead | MarkovShortHead) -> dict:
    structure = {"kind": head.kind, "vocab_size": head.vocab_size, "rank": head.rank}
    if isinstance(head, GRUShortHead):
        structure.update(embed_dim=head.embed_dim, hidden_size=head.hidden_size,
                         rank_activation=head.rank_activation)
    return structure


def tokenizer_fingerprint(tokenizer) -> str:
    """"sha256:<hex>" of the tokenizer's vocabulary (added tokens included), sorted by id.

    `tokenizer`: anything with `get_vocab() -> {token: id}` (HF tokenizers) or that mapping."""
    vocab = tokenizer if isinstance(tokenizer, Mapping) else tokenizer.get_vocab()
    entries = sorted(((int(token_id), str(token)) for token, token_id in vocab.items()))
    payload = json.dumps(entries, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return "sha256:" + hashlib.sha256(payload).hexdigest()


def _is_dels_folder(path: Path) -> bool:
    config_path = path / CONFIG_NAME
    if not config_path.is_file():
        return False
    try:
        return "liliprop_dels_format" in json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False


def _reads_as_json(path: Path) -> bool:
    try:
        json.loads(path.read_text())
        return True
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False


def find_dels_dir(path: str | Path) -> Path:
    """`path` itself if it is a DeLS head folder, else `path/dels`; ValueError if neither."""
    path = Path(path)
    for candidate in (path, path / DELS_SUBFOLDER):
        if _is_dels_folder(candidate):
            return candidate
        config_path = candidate / CONFIG_NAME
        if config_path.is_file() and not _reads_as_json(config_path):  # damaged, not absent
            raise ValueError(f"{config_path} is not valid JSON; the file is damaged: copy it "
                             "again or re-export the head with save_dels_head")
    raise ValueError(f"no DeLS head at {path}: expected {path / CONFIG_NAME} or "
                     f"{path / DELS_SUBFOLDER / CONFIG_NAME} with 'liliprop_dels_format'; "
                     "write one with save_dels_head")


def save_dels_head(dir: str | Path, head: GRUShortHead | MarkovShortHead, prior: UnigramPrior,
                   config: DelsConfig) -> Path:
    """Write config.json and model.safetensors into `dir` (created if needed); returns `dir`.

    `dir` is the head's own folder (e.g. `<draft_dir>/dels`); a folder holding some other
    config.json (a draft model's) is refused so that it is never overwritten."""
    dir = Path(dir)
    if (dir / CONFIG_NAME).exists() and not _is_dels_folder(dir):
        raise ValueError(f"{dir / CONFIG_NAME} exists and is not a DeLS config (a model's?); "
                         f"save into {dir / DELS_SUBFOLDER} instead")
    for name, value in head_structure(head).items():
        if getattr(config, name) != value:
            raise ValueError(f"config.{name}={getattr(config, name)!r} does not match the head "
                             f"({value!r}); build the config with DelsConfig.for_head")
    if prior.vocab_size != head.vocab_size:
        raise ValueError(f"prior has {prior.vocab_size} entries but the head vocab_size is "
                         f"{head.vocab_size}; build the prior for the head's vocabulary")

    tensors = {name: tensor.detach().cpu().contiguous().clone()
               for name, tensor in head.state_dict().items()}
    if isinstance(head, GRUShortHead) and config.embedding_source == "checkpoint":
        tensors[EMBED_KEY] = head.embed_weight.detach().cpu().contiguous().clone()
    tensors[PRIOR_KEY] = prior.log_probs.detach().float().cpu().contiguous()
    dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dir / WEIGHTS_NAME), metadata={"liliprop_dels_format": str(DELS_FORMAT_VERSION)})
    (dir / CONFIG_NAME).write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    return dir


def _load_head_weights(head, tensors: dict, source: str) -> None:
    own = head.state_dict()
    missing = sorted(set(own) - set(tensors))
    unexpected = sorted(set(tensors) - set(own))
    if missing or unexpected:
        raise ValueError(f"{source}: head weights do not match kind={head.kind!r}: missing {missing}, "
                         f"unexpected {unexpected}; re-export the head with save_dels_head")
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise ValueError(f"{source}: weight {name!r} has shape {tuple(tensor.shape)} but the config "
                             f"implies {tuple(own[name].shape)}; config.json and the weights disagree")
    head.load_state_dict(tensors)


def build_dels_head(config: DelsConfig, target_embedding_weight: torch.Tensor | None,
                    embed_weight_from_checkpoint: torch.Tensor | None = None, *,
                    device=None, dtype=None) -> GRUShortHead | MarkovShortHead:
    """An (untrained) head of the shape `config` describes. For a GRU head the embedding is
    the target's table, or the checkpoint's when config.embedding_source == "checkpoint"."""
    if config.kind == "markov":
        return MarkovShortHead(config.vocab_size, config.rank, device=device, dtype=dtype)
    if config.embedding_source == "checkpoint":
        if embed_weight_from_checkpoint is None:
            raise ValueError(f"embedding_source='checkpoint' but {EMBED_KEY!r} is not in the weights; "
                             "re-export the head or set embedding_source='target'")
        embed_weight = embed_weight_from_checkpoint.to(device=device)
    else:
        if target_embedding_weight is None:
            raise ValueError("target_embedding_weight is required for a GRU head with "
                             "embedding_source='target'; pass the target model's input embedding weight")
        embed_weight = target_embedding_weight
    if embed_weight.dim() != 2:
        raise ValueError(f"target_embedding_weight must be [V, D], got shape {tuple(embed_weight.shape)}")
    rows, width = embed_weight.shape
    if width != config.embed_dim:
        raise ValueError(f"embed_dim: the head reads {config.embed_dim}-wide embeddings but the "
                         f"embedding table is {width} wide; the head was trained for another target "
                         "model, train or load a head for this one")
    if rows != config.vocab_size:
        raise ValueError(f"vocab_size: the embedding table has {rows} rows but the head config says "
                         f"{config.vocab_size}; use a head trained for this target model")
    return GRUShortHead(embed_weight, config.hidden_size, config.rank, config.rank_activation,
                        device=device, dtype=dtype)


def read_dels_config(path: Path) -> DelsConfig:
    """A DeLS config.json; every error names the file."""
    try:
        return DelsConfig.from_dict(json.loads(path.read_text()))
    except ValueError as exc:  # JSONDecodeError is a ValueError too
        raise ValueError(f"{path}: {exc}") from None


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a DeLS model.safetensors; a missing, truncated or corrupt file names
    itself (safetensors' own error names neither the file nor a fix)."""
    if not path.is_file():
        raise ValueError(f"{path} is missing; re-export the head with save_dels_head")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"{path} cannot be read as safetensors ({exc}); the file is truncated "
                         "or damaged: copy it again or re-export the head with save_dels_head"
                         ) from None


def load_dels_head(dir: str | Path, target_embedding_weight: torch.Tensor | None,
                   expected_vocab_size: int, expected_tokenizer_fingerprint: str | None = None, *,
                   device: torch.device | str | None = None, dtype: torch.dtype | None = None
                   ) -> tuple[GRUShortHead | MarkovShortHead, UnigramPrior, DelsConfig]:
    """Load and validate a DeLS head folder (or a folder holding `dels/`).

    target_embedding_weight [V, D]: the target's input embedding (shared, not copied); may be
    None for Markov heads. expected_vocab_size: the drafter's logits width. The head's weights
    are placed on `device` in `dtype` (defaults: the embedding's device, else CPU; fp32); the
    prior is fp32 on `device`.
    Every mismatch raises ValueError naming the config field and the fix.
    """
    folder = find_dels_dir(dir)
    if device is None:
        device = target_embedding_weight.device if target_embedding_weight is not None else "cpu"
    config = read_dels_config(folder / CONFIG_NAME)
    if config.vocab_size != expected_vocab_size:
        raise ValueError(f"vocab_size: the DeLS head at {folder} was trained for vocab_size="
                         f"{config.vocab_size} but the drafter has {expected_vocab_size} logits; "
                         "use a head trained for this target model")
    if expected_tokenizer_fingerprint is not None:
        if config.tokenizer_fingerprint is None:
            warnings.warn(f"the DeLS head at {folder} records no tokenizer_fingerprint; cannot check "
                          "that it was trained with this tokenizer", stacklevel=2)
        elif config.tokenizer_fingerprint != expected_tokenizer_fingerprint:
            raise ValueError(f"tokenizer_fingerprint: the DeLS head at {folder} was trained with a "
                             f"different tokenizer ({config.tokenizer_fingerprint} vs "
                             f"{expected_tokenizer_fingerprint}); train the head and prior with the "
                             "target's tokenizer")
    weights_path = folder / WEIGHTS_NAME
    tensors = _read_weights(weights_path)
    log_probs = tensors.pop(PRIOR_KEY, None)
    if log_probs is None:
        raise ValueError(f"{weights_path} has no {PRIOR_KEY!r}; save the head with its UnigramPrior")
    if tuple(log_probs.shape) != (config.vocab_size,):
        raise ValueError(f"{weights_path}: {PRIOR_KEY} has shape {tuple(log_probs.shape)} but vocab_size is "
                         f"{config.vocab_size}; rebuild the prior for this vocabulary")
    # Refused here rather than faulting on every row at run time (vllm_liliprop/faults.py).
    check_loaded_weights({PRIOR_KEY: log_probs}, str(weights_path),
                         "rebuild the prior with UnigramPrior.from_counts(counts, smoothing > 0) "
                         "and save it with save_dels_head")
    check_loaded_weights(tensors, str(weights_path),
                         "the head diverged in training or the file is damaged: retrain or "
                         "re-export it with save_dels_head")
    checkpoint_embed = tensors.pop(EMBED_KEY, None)
    head = build_dels_head(config, target_embedding_weight, checkpoint_embed, device=device, dtype=dtype)
    _load_head_weights(head, tensors, str(weights_path))
    head.eval()
    prior = UnigramPrior(log_probs.to(device), smoothing=config.prior_smoothing)
    return head, prior, config


def import_dels_spec_checkpoint(checkpoint_path: str | Path, prior_path: str | Path,
                                target_embedding_weight: torch.Tensor | None, *,
                                target_lm_head_weight: torch.Tensor | None = None,
                                smoothing: float = 1.0, tokenizer_fingerprint: str | None = None,
                                alpha: float | list[float] = DEFAULT_FUSION_WEIGHT,
                                beta: float | list[float] = DEFAULT_FUSION_WEIGHT
                                ) -> tuple[GRUShortHead | MarkovShortHead, UnigramPrior, DelsConfig]:
    """Read a head released in the public DeLS-Spec layout (github dt-3t/DeLS-Spec).

    checkpoint_path: `local_head.pt` / `merged_rnn_local_head.pt` (GRU; model_config +
      model_state_dict with prefix_gru.*, rank_proj.weight and low_rank_lm_head.weight, or
      rank_to_hidden.weight when lm_head_mode == "target_lm_head"), `merged_markov_local_head.pt`
      (embedding_weight, lm_head_weight) or `markov_local_head.pt` (down_proj, up_proj).
    prior_path: `loss_mask_unigram.pt` ({"counts": [V]} or a tensor), `.npz` with "counts", or a
      folder holding one of them; counts shorter than V are zero-padded like the public runtime.
    target_lm_head_weight [V, hidden]: needed for "target_lm_head" GRU heads and markov_local_head.pt.
    The result uses pure_draft_prefix_len = 1, the public runtime's rule. Save it with
    `save_dels_head` to get this project's format.
    """
    checkpoint = torch.load(str(checkpoint_path), map_location="cpu", weights_only=True)
    if not isinstance(checkpoint, Mapping):
        raise ValueError(f"{checkpoint_path}: expected a dict checkpoint, got {type(checkpoint).__name__}")
    state = checkpoint.get("model_state_dict")
    public_config = checkpoint.get("model_config") or {}

    embedding_source = "target"
    if "embedding_weight" in checkpoint and "lm_head_weight" in checkpoint:
        head = _markov_from_weights(checkpoint["embedding_weight"], checkpoint["lm_head_weight"])
    elif isinstance(state, Mapping) and "down_proj" in state and "up_proj" in state:
        if target_embedding_weight is None or target_lm_head_weight is None:
            raise ValueError(f"{checkpoint_path} is an unmerged Markov head (down_proj/up_proj); pass "
                             "target_embedding_weight and target_lm_head_weight to merge it")
        head = _markov_from_weights(target_embedding_weight.float() @ state["down_proj"].float(),
                                    target_lm_head_weight.float() @ state["up_proj"].float().T)
    elif isinstance(state, Mapping) and any(name.startswith("prefix_gru.") for name in state):
        head, embedding_source = _gru_from_public(state, public_config, target_embedding_weight,
                                                  target_lm_head_weight, str(checkpoint_path))
    else:
        raise ValueError(f"{checkpoint_path}: not a DeLS-Spec local head (expected prefix_gru.* "
                         "weights, embedding_weight/lm_head_weight, or down_proj/up_proj)")

    prior = UnigramPrior.from_counts(_read_public_counts(Path(prior_path), head.vocab_size), smoothing)
    config = DelsConfig.for_head(head, prior, embedding_source=embedding_source,
                                 pure_draft_prefix_len=1, tokenizer_fingerprint=tokenizer_fingerprint,
                                 alpha=alpha, beta=beta)
    head.eval()
    return head, prior, config


def _markov_from_weights(state_embed: torch.Tensor, vocab_rows: torch.Tensor) -> MarkovShortHead:
    if state_embed.dim() != 2 or state_embed.shape != vocab_rows.shape:
        raise ValueError(f"Markov weights must both be [V, r]; got {tuple(state_embed.shape)} and "
                         f"{tuple(vocab_rows.shape)}")
    head = MarkovShortHead(state_embed.shape[0], state_embed.shape[1])
    head.load_state_dict({"state_embed.weight": state_embed.float(),
                          "rank_to_vocab.weight": vocab_rows.float()})
    return head


def _gru_from_public(state: Mapping, public_config: Mapping, target_embedding_weight,
                     target_lm_head_weight, source: str) -> tuple[GRUShortHead, str]:
    """(head, embedding_source) from a public model_state_dict / model_config."""
    if "embed_down_proj.weight" in state:
        raise ValueError(f"{source} has an input projection (embed_down_proj); convert it with the "
                         "public SpecForge scripts/convert_local_head.py (merged_rnn_local_head.pt) first")
    direct_vocab = (public_config.get("rnn_parameterization",
                                      public_config.get("local_head_parameterization")) == "direct_vocab"
                    or public_config.get("architecture") == "direct_vocab_rnn")
    if direct_vocab:
        if "embed_tokens.weight" not in state:
            raise ValueError(f"{source} is a direct-vocab head but has no embed_tokens.weight")
        embed_weight = state["embed_tokens.weight"].float()
    elif target_embedding_weight is None:
        raise ValueError(f"{source} reads the target's embedding table; pass target_embedding_weight")
    else:
        embed_weight = target_embedding_weight

    if "low_rank_lm_head.weight" in state:
        vocab_rows = state["low_rank_lm_head.weight"].float()
    elif "rank_to_hidden.weight" in state:
        if target_lm_head_weight is None:
            raise ValueError(f"{source} uses lm_head_mode='target_lm_head'; pass target_lm_head_weight "
                             "[V, hidden] so its vocabulary head can be merged")
        vocab_rows = target_lm_head_weight.float() @ state["rank_to_hidden.weight"].float()
    else:
        raise ValueError(f"{source} has neither low_rank_lm_head.weight nor rank_to_hidden.weight")

    hidden_size = state["prefix_gru.weight_hh_l0"].shape[1]
    rank = state["rank_proj.weight"].shape[0]
    expected_vocab = public_config.get("vocab_size", vocab_rows.shape[0])
    if embed_weight.shape[0] != vocab_rows.shape[0] or vocab_rows.shape[0] != expected_vocab:
        raise ValueError(f"vocab_size: {source} has a {vocab_rows.shape[0]}-row vocabulary head and "
                         f"model_config vocab_size={expected_vocab}, but the embedding table has "
                         f"{embed_weight.shape[0]} rows; use the target model the head was trained for")
    if embed_weight.shape[1] != state["prefix_gru.weight_ih_l0"].shape[1]:
        raise ValueError(f"embed_dim: {source} reads {state['prefix_gru.weight_ih_l0'].shape[1]}-wide "
                         f"embeddings but the table is {embed_weight.shape[1]} wide; use the target "
                         "model the head was trained for")
    head = GRUShortHead(embed_weight, hidden_size, rank,
                        public_config.get("rank_activation", "identity"))
    head.load_state_dict({"gru.weight_ih_l0": state["prefix_gru.weight_ih_l0"].float(),
                          "gru.weight_hh_l0": state["prefix_gru.weight_hh_l0"].float(),
                          "to_rank.weight": state["rank_proj.weight"].float(),
                          "rank_to_vocab.weight": vocab_rows})
    return head, "checkpoint" if direct_vocab else "target"


def _read_public_counts(path: Path, vocab_size: int) -> torch.Tensor:
    if path.is_dir():
        for name in ("loss_mask_unigram.pt", "loss_mask_unigram.npz"):
            if (path / name).is_file():
                path = path / name
                break
        else:
            raise ValueError(f"{path} holds neither loss_mask_unigram.pt nor loss_mask_unigram.npz")
    if path.suffix == ".pt":
        stats = torch.load(str(path), map_location="cpu", weights_only=True)
        counts = stats["counts"] if isinstance(stats, Mapping) and "counts" in stats else stats
        if not isinstance(counts, torch.Tensor):
            raise ValueError(f"{path}: expected a counts tensor or a dict with 'counts'")
    elif path.suffix == ".npz":
        with np.load(path) as stats:
            if "counts" not in stats.files:
                raise ValueError(f"{path} has no 'counts' array")
            counts = torch.from_numpy(stats["counts"])
    else:
        raise ValueError(f"prior_path {path} must be a .pt, a .npz or a folder holding one")
    counts = counts.reshape(-1).to(torch.float64)
    if counts.numel() > vocab_size:
        raise ValueError(f"{path}: {counts.numel()} counts for a {vocab_size}-token head; this prior "
                         "belongs to another vocabulary")
    return torch.cat([counts, counts.new_zeros(vocab_size - counts.numel())])
