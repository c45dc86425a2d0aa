"""A DFlash drafter in plain PyTorch, weight-compatible with vLLM's `DFlashDraftModel`.

Serving (vLLM 0.32, `v1/spec_decode/dflash.py` + `models/qwen3_dflash.py`) works like this for
one request whose last verified token sits at position p:

* context: the target's hidden states at `target_layer_ids` (the output of those layers) for
  every verified token 0..p, concatenated in ascending layer order, projected by `fc` and
  normalized by `hidden_norm`. Each draft layer turns this one context state into K/V with its
  own `k_proj`/`v_proj`, `k_norm` and RoPE at the token's position. The context never runs
  through the draft layers.
* query block: [anchor, mask x (B-1)] at positions p+1 .. p+B, where the anchor is the token
  the target just emitted (its own target hidden state does not exist yet, so the context is
  every position strictly before the anchor). Block tokens are embedded by the target's frozen
  embedding table; masks use `mask_token_id`'s row.
* attention is non-causal: every block token sees the whole context and the whole block.
* the draft's output at slot s (after the final `norm`) goes through the target's `lm_head`
  and predicts the token at position p+1+s; slot 0 (the anchor) is not sampled.

Training reproduces this exactly for many anchors per sequence at once: all anchors of a
sequence share the context K/V, and a boolean mask lets block n see the context positions
< anchor_n plus its own block only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vllm_liliprop.checkpoints import dflash_hf_config

__all__ = [
    "DrafterConfig",
    "DFlashDrafter",
    "RMSNorm",
    "default_target_layer_ids",
    "block_attention_mask",
    "rope_cos_sin",
]


def default_target_layer_ids(num_target_layers: int, num_taps: int) -> list[int]:
    """Evenly spaced target layers from layer 1 to layer L-3 (the usual DFlash choice).

    For a 36-layer target and 5 taps this gives [1, 9, 17, 25, 33].
    """
    if num_target_layers < 1 or num_taps < 1:
        raise ValueError(f"need num_target_layers >= 1 and num_taps >= 1, got {num_target_layers}, {num_taps}")
    if num_taps == 1:
        return [num_target_layers // 2]
    first, last = 1, max(1, num_target_layers - 3)
    if num_target_layers < 4 or num_taps > last - first + 1:
        return sorted({round(i * (num_target_layers - 1) / (num_taps - 1)) for i in range(num_taps)})
    return [round(first + i * (last - first) / (num_taps - 1)) for i in range(num_taps)]


@dataclass
class DrafterConfig:
    """Shape of a DFlash drafter. `hidden_size` must equal the target's (shared embeddings)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    target_layer_ids: list[int]
    mask_token_id: int
    block_size: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    hidden_act: str = "silu"
    extra_hf_config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.target_layer_ids = [int(i) for i in self.target_layer_ids]
        if not self.target_layer_ids:
            raise ValueError("target_layer_ids must name at least one target layer")
        if self.target_layer_ids != sorted(set(self.target_layer_ids)):
            # vLLM collects aux hidden states in ascending layer order; other orders would
            # silently permute fc's input blocks between training and serving.
            raise ValueError(f"target_layer_ids must be strictly increasing, got {self.target_layer_ids}")
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (anchor + at least one slot), got {self.block_size}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} is outside the vocabulary [0, {self.vocab_size})")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act must be 'silu' (Qwen3 MLP), got {self.hidden_act!r}")

    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids)

    @classmethod
    def from_target(
        cls,
        target_config: Any,
        *,
        mask_token_id: int,
        num_hidden_layers: int = 5,
        target_layer_ids: list[int] | None = None,
        block_size: int = 16,
        intermediate_size: int | None = None,
    ) -> "DrafterConfig":
        """Drafter with the target's width, heads and RoPE (a transformers Qwen3-like config)."""
        num_target_layers = int(target_config.num_hidden_layers)
        ids = target_layer_ids or default_target_layer_ids(num_target_layers, num_hidden_layers)
        if max(ids) >= num_target_layers or min(ids) < 0:
            raise ValueError(f"target_layer_ids {ids} must lie in [0, {num_target_layers})")
        heads = int(target_config.num_attention_heads)
        return cls(
            vocab_size=int(target_config.vocab_size),
            hidden_size=int(target_config.hidden_size),
            intermediate_size=int(intermediate_size or target_config.intermediate_size),
            num_hidden_layers=num_hidden_layers,
            num_attention_heads=heads,
            num_key_value_heads=int(getattr(target_config, "num_key_value_heads", heads)),
            head_dim=int(getattr(target_config, "head_dim", None) or target_config.hidden_size // heads),
            target_layer_ids=list(ids),
            mask_token_id=mask_token_id,
            block_size=block_size,
            rms_norm_eps=float(target_config.rms_norm_eps),
            rope_theta=float(_rope_theta(target_config)),
            max_position_embeddings=int(target_config.max_position_embeddings),
        )

    def to_hf_dict(self, architectures: list[str] | None = None) -> dict[str, Any]:
        """A Qwen3 `config.json` that vLLM reads as a DFlash draft."""
        config = dflash_hf_config(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim, rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta,
            max_position_embeddings=self.max_position_embeddings, mask_token_id=self.mask_token_id,
            target_layer_ids=self.target_layer_ids, block_size=self.block_size,
            hidden_act=self.hidden_act, architectures=architectures)
        config.update(self.extra_hf_config)
        return config

    @classmethod
    def from_hf_dict(cls, config: dict[str, Any]) -> "DrafterConfig":
        dflash = config.get("dflash_config") or {}
        for key in ("mask_token_id", "target_layer_ids"):
            if key not in dflash:
                raise ValueError(f"config.json dflash_config lacks {key!r}; it is not a DFlash draft")
        heads = config["num_attention_heads"]
        return cls(
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_hidden_layers=config["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=config.get("num_key_value_heads", heads),
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            target_layer_ids=list(dflash["target_layer_ids"]),
            mask_token_id=dflash["mask_token_id"],
            block_size=dflash.get("block_size", config.get("block_size", 16)),
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=_rope_theta(config),
            max_position_embeddings=config.get("max_position_embeddings", 40960),
            hidden_act=config.get("hidden_act", "silu"),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DrafterConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown DrafterConfig fields {sorted(unknown)}; known: {sorted(known)}")
        return cls(**data)


def _rope_theta(config: Any) -> float:
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    params = get("rope_parameters") or get("rope_scaling") or {}
    if params.get("rope_type", params.get("type", "default")) not in ("default", None):
        raise ValueError(f"only default RoPE is supported for training, got rope_parameters={params}")
    theta = params.get("rope_theta") or get("rope_theta")
    return float(theta if theta is not None else 1_000_000.0)


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 and cast back before the weight, like vLLM and HF Qwen3."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style RoPE tables for integer positions [...] -> cos, sin [..., head_dim] (float32)."""
    inv_freq = 1.0 / theta ** (
        torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    )
    angles = positions.float().unsqueeze(-1) * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., L, heads, head_dim]; cos/sin [..., L, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class DrafterAttention(nn.Module):
    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        hidden, hd = config.hidden_size, config.head_dim
        self.q_proj = nn.Linear(hidden, self.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.num_heads * hd, hidden, bias=False)
        self.q_norm = RMSNorm(hd, config.rms_norm_eps)
        self.k_norm = RMSNorm(hd, config.rms_norm_eps)

    def key_value(
        self, states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """states [..., L, H] -> K, V [..., L, kv_heads, head_dim] (K normed and rotated)."""
        k = self.k_proj(states).unflatten(-1, (self.num_kv_heads, self.head_dim))
        v = self.v_proj(states).unflatten(-1, (self.num_kv_heads, self.head_dim))
        return _apply_rope(self.k_norm(k), cos, sin), v

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        context_k: torch.Tensor,
        context_v: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """hidden [B, Q, H] (all blocks of a sequence flattened); context_k/v [B, T, kv, hd];
        mask [B, Q, T + Q] bool (True = may attend)."""
        q = self.q_proj(hidden).unflatten(-1, (self.num_heads, self.head_dim))
        q = _apply_rope(self.q_norm(q), cos, sin)
        block_k, block_v = self.key_value(hidden, cos, sin)
        k = torch.cat([context_k, block_k], dim=1)
        v = torch.cat([context_v, block_v], dim=1)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2).to(q.dtype),
            v.transpose(1, 2).to(q.dtype),
            attn_mask=mask.unsqueeze(1),
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        return self.o_proj(out.transpose(1, 2).flatten(-2))


class DrafterMLP(nn.Module):
    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DrafterLayer(nn.Module):
    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.self_attn = DrafterAttention(config)
        self.mlp = DrafterMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, context_k: torch.Tensor,
                context_v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """One pre-norm block: x [B, Q, H] attends to the context K/V and to itself
        (`DrafterAttention.forward`), then the MLP; both residual."""
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, context_k, context_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


def block_attention_mask(anchors: torch.Tensor, context_len: int, block_size: int) -> torch.Tensor:
    """Which keys each block query may attend to.

    anchors [B, N] int (position of each block's anchor token). Keys are laid out as
    [context positions 0..T-1 | block 0 | block 1 | ...]. Returns bool [B, N*bs, T + N*bs]:
    block n sees context positions < anchors[:, n] and all of its own block.
    """
    batch, num_blocks = anchors.shape
    device = anchors.device
    queries = num_blocks * block_size
    query_block = torch.arange(queries, device=device) // block_size
    context_pos = torch.arange(context_len, device=device)
    sees_context = context_pos.view(1, 1, -1) < anchors.repeat_interleave(block_size, dim=1).unsqueeze(-1)
    sees_block = (query_block.view(-1, 1) == query_block.view(1, -1)).expand(batch, -1, -1)
    return torch.cat([sees_context, sees_block], dim=-1)


class DFlashDrafter(nn.Module):
    """The trainable DFlash draft; its `state_dict()` names are vLLM's checkpoint names.

    The target's embedding table and LM head are not part of this module (vLLM shares them
    from the target when the checkpoint omits them); callers embed block tokens and project
    outputs with the frozen target weights.
    """

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(DrafterLayer(config) for _ in range(config.num_hidden_layers))
        self.fc = nn.Linear(config.hidden_size * config.num_taps, config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
            elif isinstance(module, RMSNorm):
                module.weight.fill_(1.0)
        # Down/out projections scaled by depth, as in GPT-2 style initialization.
        for layer in self.layers:
            layer.self_attn.o_proj.weight.mul_(1.0 / math.sqrt(2 * len(self.layers)))
            layer.mlp.down_proj.weight.mul_(1.0 / math.sqrt(2 * len(self.layers)))

    def context_states(self, target_taps: torch.Tensor) -> torch.Tensor:
        """hidden_norm(fc(taps)): [..., T, H * num_taps] -> [..., T, H].

        This is exactly what vLLM caches as context (fc in `combine_hidden_states`, then
        hidden_norm in `precompute_and_store_context_kv`), and the anchor state a candidate head
        reads is this tensor at the position just before the anchor.
        """
        expected = self.fc.in_features
        if target_taps.shape[-1] != expected:
            raise ValueError(
                f"target_taps last dim is {target_taps.shape[-1]}, expected hidden_size * "
                f"len(target_layer_ids) = {expected}"
            )
        return self.hidden_norm(self.fc(target_taps))

    def forward(
        self, block_embeds: torch.Tensor, context: torch.Tensor, anchors: torch.Tensor
    ) -> torch.Tensor:
        """Run N blocks per sequence against one shared context.

        block_embeds [B, N, bs, H]: target embeddings of [anchor token, mask x (bs-1)];
        context [B, T, H]: `context_states(...)` for positions 0..T-1 (padding beyond a
        sequence's end is never visible because anchors lie inside it);
        anchors [B, N] int64 positions (>= 1) of the anchor tokens.
        Returns the final-normed hidden states [B, N, bs, H]. Block entry j sits at position
        anchor + j, and for j >= 1 its output (through the LM head) predicts the token there.
        """
        batch, num_blocks, block_size, hidden = block_embeds.shape
        if anchors.shape != (batch, num_blocks):
            raise ValueError(f"anchors has shape {tuple(anchors.shape)}, expected {(batch, num_blocks)}")
        if context.shape[0] != batch or context.shape[-1] != hidden:
            raise ValueError(f"context has shape {tuple(context.shape)}, expected [B={batch}, T, H={hidden}]")
        cfg = self.config
        context_len = context.shape[1]
        block_pos = anchors.unsqueeze(-1) + torch.arange(block_size, device=anchors.device)
        block_cos, block_sin = rope_cos_sin(block_pos.flatten(1), cfg.head_dim, cfg.rope_theta)
        ctx_pos = torch.arange(context_len, device=context.device).expand(batch, -1)
        ctx_cos, ctx_sin = rope_cos_sin(ctx_pos, cfg.head_dim, cfg.rope_theta)
        mask = block_attention_mask(anchors, context_len, block_size)

        x = block_embeds.flatten(1, 2)
        for layer in self.layers:
            context_k, context_v = layer.self_attn.key_value(context, ctx_cos, ctx_sin)
            x = layer(x, block_cos, block_sin, context_k, context_v, mask)
        return self.norm(x).view(batch, num_blocks, block_size, hidden)
