"""LiLiCorr lattice head: scores the top-K candidate lattice of one draft block in one pass.

Paper: LiLiCorr, Section 3.2 and Appendix A. Every candidate (slot s, rank k) becomes a node

    node[s, k] = token_proj(embed(c[s, k])) + pass_hidden_proj(h[s])
                 + feature_mlp(feature_norm(confidence features)) + slot_emb[s] + rank_emb[k]

A small bidirectional Transformer attends over all (S * K) nodes with two learned per-head
attention biases (signed slot distance, same slot). Each node is then fused with the target's
anchor state a through one linear layer over [x, a, x * a] and a SiLU, and emits unit-norm out
and in vectors. The anchor gets its own out vector. Scores are cosines times `logit_scale`:

    start[b, j]      = scale * <anchor_out[b], in[b, 0, j]>
    pairs[b, s, i, j] = scale * <out[b, s, i], in[b, s + 1, j]>

Parameter names and shapes equal upstream vLLM's `LiLiCorrHead` (checkpoint prefix `lilicorr.`),
so upstream checkpoints load with `load_state_dict(strict=True)` and exports load upstream.
Plain torch: differentiable for training, usable under `torch.inference_mode` for serving.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vllm_liliprop.heads.lattice_prior import PRIOR_KEY

NUM_CANDIDATE_FEATURES = 5
MAX_CANDIDATE_TOPK = 16
INIT_STD = 0.02

# dflash_config field suffix -> LatticeConfig attribute; the config.json keys are
# `lilicorr_<suffix>`.
_DFLASH_FIELDS = (
    "candidate_topk",
    "hidden_size",
    "num_layers",
    "num_heads",
    "mlp_ratio",
    "factor_dim",
    "vector_eps",
    "logit_scale",
)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(
        value
    )


def _field_error(field: str, value: Any, requirement: str, fix: str) -> ValueError:
    return ValueError(f"dflash_config.lilicorr_{field} = {value!r} {requirement}; {fix}.")


def _is_topk(k: Any) -> bool:
    return _is_int(k) and 1 <= k <= MAX_CANDIDATE_TOPK and not k & (k - 1)


# suffix -> (valid, requirement, fix): each head field on its own. The checks that need the
# draft's width (num_heads divides it, int(width * mlp_ratio) >= 1) are in `__post_init__`.
_FIELD_RULES = {
    "candidate_topk": (_is_topk, f"must be a power-of-two int in 1..{MAX_CANDIDATE_TOPK}",
                       "set it to 1, 2, 4, 8 or 16 (the paper uses 8)"),
    "hidden_size": (lambda v: _is_int(v) and v >= 0, "must be an int >= 0",
                    "set it to 0 for the draft model's width or to a positive head width"),
    "num_layers": (lambda v: _is_int(v) and v >= 0, "must be an int >= 0",
                   "set it to e.g. 2 (the paper)"),
    "num_heads": (lambda v: _is_int(v) and v >= 1, "must be an int >= 1",
                  "set it to e.g. 8 (the paper)"),
    "mlp_ratio": (lambda v: _is_real(v) and v > 0, "must be a finite number > 0",
                  "set it to e.g. 2.0 (the paper)"),
    "factor_dim": (lambda v: _is_int(v) and v >= 1, "must be an int >= 1",
                   "set it to e.g. 1024 (the paper)"),
    "vector_eps": (lambda v: _is_real(v) and v > 0, "must be a finite float > 0",
                   "set it to e.g. 1e-6"),
    "logit_scale": (lambda v: _is_real(v) and v > 0, "must be a finite float > 0",
                    "set it to e.g. 8.0 (the paper)"),
}


def check_prior_weight(value: Any) -> None:
    """The liliprop extension's prior weight: a finite number >= 0 (0: upstream's walk)."""
    if not (_is_real(value) and value >= 0):
        raise ValueError(f"dflash_config.{PRIOR_KEY} = {value!r} must be a finite number >= 0; set "
                         "it to the weight training learned, or remove it for upstream's walk.")


def _check_field(name: str, value: Any) -> None:
    valid, requirement, fix = _FIELD_RULES[name]
    if not valid(value):
        raise _field_error(name, value, requirement, fix)


def read_dflash_fields(dflash_config: Any) -> dict[str, Any]:
    """The eight `lilicorr_*` head fields of a checkpoint's `dflash_config`, by suffix, each
    checked on its own (presence, type, range); ValueError naming the field and the fix.

    Needs no model: the plugin calls it before vLLM builds its LiLiCorr model, which reports a
    missing field as a bare KeyError and a wrong type as a TypeError from its constructor."""
    if not isinstance(dflash_config, dict):
        raise ValueError(
            f"dflash_config must be a dict, got {type(dflash_config).__name__}; pass "
            "config.json's dflash_config."
        )
    if dflash_config.get("lilicorr_enabled", True) is not True:
        raise ValueError(
            f"dflash_config.lilicorr_enabled = {dflash_config['lilicorr_enabled']!r}: this "
            "checkpoint declares no LiLiCorr head; set it to true or load it as plain DFlash."
        )
    missing = [
        f"dflash_config.lilicorr_{f}" for f in _DFLASH_FIELDS if f"lilicorr_{f}" not in dflash_config
    ]
    if missing:
        raise ValueError(
            f"{', '.join(missing)} missing; a LiLiCorr checkpoint must set every lilicorr_* "
            "field in config.json's dflash_config (see LatticeConfig.to_dflash_config)."
        )
    fields = {f: dflash_config[f"lilicorr_{f}"] for f in _DFLASH_FIELDS}
    for name, value in fields.items():
        _check_field(name, value)
    return fields


@dataclass(frozen=True)
class LatticeConfig:
    """Geometry of a LiLiCorr head, validated on construction.

    The last eight fields mirror upstream's `dflash_config.lilicorr_*` keys. `hidden_size` keeps
    the checkpoint's raw value (0 means "the draft model's width"); `width` resolves it.
    """

    model_hidden_size: int  # width of the target embeddings / draft hidden states (Hm)
    block_size: int  # trained DFlash block size B; the lattice has B - 1 slots
    rms_norm_eps: float
    candidate_topk: int  # K, a power of two in 1..16
    hidden_size: int  # head width; 0 = model_hidden_size
    num_layers: int
    num_heads: int
    mlp_ratio: float
    factor_dim: int  # d_e, width of the out / in vectors
    vector_eps: float  # eps of the unit normalization
    logit_scale: float  # sigma: cosines are scaled into logits by it
    # liliprop extension (heads.lattice_prior): weight of the drafter's log-probs added to the
    # walk's scores; 0 is upstream's walk. Stored as dflash_config.liliprop_lattice_prior_weight.
    prior_weight: float = 0.0

    def __post_init__(self) -> None:
        if not _is_int(self.model_hidden_size) or self.model_hidden_size < 1:
            raise ValueError(
                f"model_hidden_size = {self.model_hidden_size!r} must be a positive int; "
                "pass the draft config's hidden_size."
            )
        if not _is_int(self.block_size) or self.block_size < 2:
            raise ValueError(
                f"block_size = {self.block_size!r} must be an int >= 2 (anchor plus at least "
                "one drafted slot); pass dflash_config.block_size."
            )
        if not _is_real(self.rms_norm_eps) or self.rms_norm_eps <= 0:
            raise ValueError(
                f"rms_norm_eps = {self.rms_norm_eps!r} must be a finite float > 0; "
                "pass the draft config's rms_norm_eps."
            )
        for name, value in self.dflash_fields().items():
            _check_field(name, value)
        check_prior_weight(self.prior_weight)
        if self.width % self.num_heads:
            raise _field_error(
                "num_heads", self.num_heads,
                f"must divide the head width {self.width} (lilicorr_hidden_size "
                f"{self.hidden_size}, draft width {self.model_hidden_size})",
                "set it to a divisor of the head width",
            )
        if int(self.width * self.mlp_ratio) < 1:
            raise _field_error(
                "mlp_ratio", self.mlp_ratio,
                f"must make int(width * mlp_ratio) >= 1 (width {self.width})",
                "set it to e.g. 2.0 (the paper)",
            )

    def dflash_fields(self) -> dict[str, Any]:
        """The eight head fields by suffix (`candidate_topk`, ...), as in `_DFLASH_FIELDS`."""
        return {f: getattr(self, f) for f in _DFLASH_FIELDS}

    @property
    def width(self) -> int:
        """Head width H (resolves lilicorr_hidden_size = 0 to the draft width)."""
        return self.hidden_size or self.model_hidden_size

    @property
    def num_slots(self) -> int:
        """Learned candidate slots, block_size - 1."""
        return self.block_size - 1

    @property
    def mlp_hidden_size(self) -> int:
        return int(self.width * self.mlp_ratio)

    @classmethod
    def from_dflash_config(
        cls,
        dflash_config: dict[str, Any],
        model_hidden_size: int,
        block_size: int,
        rms_norm_eps: float,
    ) -> "LatticeConfig":
        """Read the `lilicorr_*` keys of a checkpoint's `dflash_config` (upstream format)."""
        fields = read_dflash_fields(dflash_config)
        return cls(
            model_hidden_size=model_hidden_size,
            block_size=block_size,
            rms_norm_eps=rms_norm_eps,
            prior_weight=dflash_config.get(PRIOR_KEY, 0.0),
            **fields,
        )

    def to_dflash_config(self) -> dict[str, Any]:
        """The `lilicorr_*` keys to merge into an exported checkpoint's `dflash_config`."""
        out: dict[str, Any] = {"lilicorr_enabled": True}
        out.update({f"lilicorr_{f}": getattr(self, f) for f in _DFLASH_FIELDS})
        if self.prior_weight:  # the extension's key only where it changes the walk
            out[PRIOR_KEY] = self.prior_weight
        return out


class SiluMLP(nn.Module):
    """Non-gated two-layer MLP, down(silu(up(x))), both with bias (upstream NemotronHMLP)."""

    def __init__(self, in_size: int, hidden_size: int, out_size: int) -> None:
        super().__init__()
        self.up_proj = nn.Linear(in_size, hidden_size)
        self.down_proj = nn.Linear(hidden_size, out_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.up_proj(x)))


class LatticeAttention(nn.Module):
    """Full (non-causal) multi-head self-attention with a learned additive bias per head."""

    def __init__(self, width: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = width // num_heads
        # Packed q, k, v weights: upstream stores them as raw parameters, not a Linear.
        self.in_proj_weight = nn.Parameter(torch.empty(3 * width, width))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * width))
        self.out_proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, attn_bias: torch.Tensor) -> torch.Tensor:
        """x [B, L, H]; attn_bias [1, heads, L, L] added to the attention logits."""
        bsz, length, width = x.shape
        q, k, v = F.linear(x, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        heads = (bsz, length, self.num_heads, self.head_dim)
        q, k, v = (t.view(heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias)
        return self.out_proj(y.transpose(1, 2).reshape(bsz, length, width))


class LatticeLayer(nn.Module):
    """Pre-norm Transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: LatticeConfig) -> None:
        super().__init__()
        width = config.width
        self.attn_norm = nn.RMSNorm(width, eps=config.rms_norm_eps)
        self.attn = LatticeAttention(width, config.num_heads)
        self.mlp_norm = nn.RMSNorm(width, eps=config.rms_norm_eps)
        self.mlp = SiluMLP(width, config.mlp_hidden_size, width)

    def forward(self, x: torch.Tensor, attn_bias: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), attn_bias)
        return x + self.mlp(self.mlp_norm(x))


def rank_features(k: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(rank / (K - 1), [rank == 0]) of the K rank-sorted candidates, fp32 [K] each."""
    rank = torch.arange(k, device=device, dtype=torch.float32)
    rank_frac = rank / float(k - 1) if k > 1 else torch.zeros_like(rank)
    return rank_frac, (rank == 0).float()


def confidence_features(log_probs: torch.Tensor, rank_frac: torch.Tensor, is_top1: torch.Tensor) -> torch.Tensor:
    """[B, S, K, 5] fp32: log p, p, log p - max_k log p, rank / (K - 1), [rank == 0]."""
    log_probs = log_probs.float()
    return torch.stack(
        [
            log_probs,
            log_probs.exp(),
            log_probs - log_probs.amax(dim=-1, keepdim=True),
            rank_frac.expand(log_probs.shape),
            is_top1.expand(log_probs.shape),
        ],
        dim=-1,
    )


class LatticeHead(nn.Module):
    """The LiLiCorr scoring head. `score()` maps one candidate lattice to start/pair logits."""

    def __init__(self, config: LatticeConfig) -> None:
        super().__init__()
        self.config = config
        hm, width = config.model_hidden_size, config.width
        if width != hm:
            self.token_proj = nn.Linear(hm, width)
        else:
            self.token_proj = nn.Identity()
        self.pass_hidden_proj = nn.Linear(hm, width)
        self.feature_norm = nn.LayerNorm(NUM_CANDIDATE_FEATURES)
        self.feature_mlp = SiluMLP(NUM_CANDIDATE_FEATURES, width, width)
        # Leading singleton dims follow the upstream checkpoint shapes.
        self.slot_embedding = nn.Parameter(torch.zeros(1, 1, config.num_slots, 1, width))
        self.rank_embedding = nn.Parameter(torch.zeros(1, 1, 1, config.candidate_topk, width))
        # Indexed by slot(q) - slot(k) + block_size - 1, i.e. over the full trained block.
        self.relative_slot_bias = nn.Parameter(
            torch.zeros(config.num_heads, 2 * config.block_size - 1)
        )
        self.same_slot_bias = nn.Parameter(torch.zeros(config.num_heads))
        self.context_proj = nn.Linear(hm, width)
        self.layers = nn.ModuleList(LatticeLayer(config) for _ in range(config.num_layers))
        self.output_norm = nn.RMSNorm(width, eps=config.rms_norm_eps)
        self.anchor_norm = nn.RMSNorm(width, eps=config.rms_norm_eps)
        self.factor_input_proj = nn.Linear(3 * width, width)
        self.out_head = nn.Linear(width, config.factor_dim)
        self.in_head = nn.Linear(width, config.factor_dim)
        self.anchor_out_head = nn.Linear(width, config.factor_dim)

        self.init_weights()

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Random init for training from scratch (upstream defines none; checkpoints overwrite it).

        GPT-2 style: every projection weight and the slot/rank tables ~ N(0, 0.02), the residual
        output projections (attn.out_proj, mlp.down_proj) scaled down by sqrt(2 * num_layers),
        all biases zero, norm gains one. The attention biases start at zero, so position enters
        only through the slot table until training learns a distance preference. Zero biases
        also make an invalid anchor (zero state) give a zero anchor vector, so start scores are
        all zero: a uniform first step. `generator` must live on the parameters' device.
        A head built on the meta device (for sizing, or to be filled by a checkpoint) is left
        as is.
        """
        if self.slot_embedding.is_meta:
            return

        def normal(t: torch.Tensor, std: float = INIT_STD) -> None:
            nn.init.normal_(t, mean=0.0, std=std, generator=generator)

        residual_std = INIT_STD / math.sqrt(2 * max(1, self.config.num_layers))
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                is_residual_out = name.endswith("attn.out_proj") or (
                    name.startswith("layers.") and name.endswith("mlp.down_proj")
                )
                normal(module.weight, residual_std if is_residual_out else INIT_STD)
                nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.RMSNorm, nn.LayerNorm)):
                nn.init.ones_(module.weight)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, LatticeAttention):
                normal(module.in_proj_weight)
                nn.init.zeros_(module.in_proj_bias)
        normal(self.slot_embedding)
        normal(self.rank_embedding)
        nn.init.zeros_(self.relative_slot_bias)
        nn.init.zeros_(self.same_slot_bias)

    def attention_bias(self, num_slots: int) -> torch.Tensor:
        """Additive attention bias [1, heads, S*K, S*K] for the first `num_slots` slots.

        bias_h(q, k) = relative_slot_bias[h, slot(q) - slot(k) + B - 1]
                       + same_slot_bias[h] * [slot(q) == slot(k)]
        The offset stays B - 1 for shorter drafts so each distance keeps its trained weight.
        """
        k = self.config.candidate_topk
        # Slot of every flattened node: [0]*K + [1]*K + ... Built per call rather than kept as
        # a buffer, so heads created on the meta device and then materialized stay correct.
        slot = torch.arange(num_slots * k, device=self.relative_slot_bias.device) // k
        distance = slot[:, None] - slot[None, :]
        same = (distance == 0).to(self.same_slot_bias.dtype)
        bias = self.relative_slot_bias[:, distance + self.config.block_size - 1]
        return (bias + self.same_slot_bias[:, None, None] * same).unsqueeze(0)

    def candidate_features(self, log_probs: torch.Tensor) -> torch.Tensor:
        """The five confidence features [B, S, K, 5] (fp32) from rank-sorted log-probs [B, S, K].

        log p, p, log p - max_k log p, rank / (K - 1), [rank == 0].
        """
        # Built per call in fp32 (not as buffers) so a bf16 head still sees exact rank features.
        return confidence_features(log_probs, *rank_features(log_probs.shape[-1], log_probs.device))

    def _check_inputs(
        self, token_embeddings, candidate_log_probs, pass_hidden, anchor_hidden, anchor_valid
    ) -> None:
        cfg = self.config
        if candidate_log_probs.dim() != 3:
            raise ValueError(
                "candidate_log_probs must be [B, S, K], got shape "
                f"{tuple(candidate_log_probs.shape)}."
            )
        bsz, n_slots, k = candidate_log_probs.shape
        hm = cfg.model_hidden_size
        if not 1 <= n_slots <= cfg.num_slots:
            raise ValueError(
                f"candidate_log_probs has S = {n_slots} slots; this head scores 1..{cfg.num_slots} "
                f"(block_size {cfg.block_size} - 1): draft fewer tokens."
            )
        if k != cfg.candidate_topk:
            raise ValueError(
                f"candidate_log_probs has K = {k} candidates per slot; this head was trained with "
                f"lilicorr_candidate_topk = {cfg.candidate_topk}: take that many candidates."
            )
        expected = {
            "token_embeddings": (token_embeddings, (bsz, n_slots, k, hm)),
            "pass_hidden": (pass_hidden, (bsz, n_slots, hm)),
            "anchor_hidden": (anchor_hidden, (bsz, hm)),
            "anchor_valid": (anchor_valid, (bsz,)),
        }
        for name, (tensor, shape) in expected.items():
            if tuple(tensor.shape) != shape:
                raise ValueError(
                    f"{name} has shape {tuple(tensor.shape)}; expected {shape} "
                    "(B, S, K from candidate_log_probs, Hm = model_hidden_size)."
                )

    def score(
        self,
        token_embeddings: torch.Tensor,
        candidate_log_probs: torch.Tensor,
        pass_hidden: torch.Tensor,
        anchor_hidden: torch.Tensor,
        anchor_valid: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Score a candidate lattice.

        Args:
            token_embeddings: [B, S, K, Hm] target input embeddings of the candidates.
            candidate_log_probs: [B, S, K] full-vocabulary log-probs, sorted descending per slot.
            pass_hidden: [B, S, Hm] draft hidden state of each slot.
            anchor_hidden: [B, Hm] normed target-context state of the last verified token.
            anchor_valid: [B] bool; False zeroes the anchor state (no verified context).
        Returns:
            start [B, K] fp32: anchor -> candidate j of slot 0.
            pairs [B, S-1, K, K] fp32: candidate i of slot s -> candidate j of slot s+1.
            Both are cosines times logit_scale. S may be below block_size - 1: the learned
            slot prefix is used.
        """
        self._check_inputs(
            token_embeddings, candidate_log_probs, pass_hidden, anchor_hidden, anchor_valid
        )
        cfg = self.config
        bsz, n_slots, k = candidate_log_probs.shape
        dtype = self.slot_embedding.dtype

        tokens = self.token_proj(token_embeddings.to(dtype))
        slot_state = self.pass_hidden_proj(pass_hidden.to(dtype)).unsqueeze(-2)
        features = self.candidate_features(candidate_log_probs).to(dtype)
        confidence = self.feature_mlp(self.feature_norm(features))
        x = tokens + slot_state + confidence
        x = x + self.slot_embedding[:, 0, :n_slots] + self.rank_embedding[:, 0]
        x = x.reshape(bsz, n_slots * k, cfg.width)

        attn_bias = self.attention_bias(n_slots)
        for layer in self.layers:
            x = layer(x, attn_bias)
        x = self.output_norm(x).reshape(bsz, n_slots, k, cfg.width)

        anchor = self.context_proj(anchor_hidden.to(dtype)) * anchor_valid[:, None].to(dtype)
        anchor = self.anchor_norm(anchor)

        # W [x, a, x*a] + b evaluated blockwise: the anchor term is computed once per request
        # instead of once per candidate, and no [.., 3H] concatenation is materialized.
        w = self.factor_input_proj.weight
        w_self, w_anchor, w_cross = w.split(cfg.width, dim=1)
        a = anchor[:, None, None, :]
        fused = F.linear(x, w_self, self.factor_input_proj.bias) + F.linear(a, w_anchor)
        fused = F.silu(fused + F.linear(x * a, w_cross))

        eps = cfg.vector_eps
        out_vec = F.normalize(self.out_head(fused), dim=-1, eps=eps)
        in_vec = F.normalize(self.in_head(fused), dim=-1, eps=eps)
        anchor_out = F.normalize(self.anchor_out_head(anchor), dim=-1, eps=eps)

        start = (anchor_out[:, None, :] * in_vec[:, 0]).sum(dim=-1)
        pairs = torch.matmul(out_vec[:, :-1], in_vec[:, 1:].transpose(-1, -2))
        return cfg.logit_scale * start.float(), cfg.logit_scale * pairs.float()

    forward = score
