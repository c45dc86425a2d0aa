"""Serving path of the LiLiCorr lattice head: `LatticeHead.score`'s scores, bit for bit, cheaper.

`LatticeHead.score` is the reference (training, export, upstream parity). `ServingLatticeHead`
wraps one head for inference and computes the same start/pair scores with fewer and cheaper
ops, all of which depend only on the head's weights and the input shapes:

- the attention bias [1, heads, S*K, S*K] is built once per draft length, not per step;
- the rank features (rank / (K - 1), [rank == 0]) are built once per K;
- the modules' forward wrappers are skipped (functional calls on the same tensors);
- for a bf16 head on a CPU with oneDNN's bf16 GEMM (AMX / AVX-512 BF16), the weights are
  repacked once into oneDNN's blocked layout (`torch.ops.mkldnn._linear_pointwise`, what
  vLLM's CPU backend runs too), so a step no longer reorders ~10 MB of weights, and layers over
  the same input share one GEMM over their stacked weights (the out and in vector heads; the
  anchor's factor term and out vector head): 15 GEMMs a step instead of 17. bf16 `F.linear` on
  such a CPU runs the same oneDNN brgemm kernel, and each output element's sum does not depend
  on the other output columns, so results are identical; `packing_matches` checks that on
  random probes when the layouts are built, and every packed GEMM checks itself against the
  reference's calls the first time it sees a row count (oneDNN picks kernels by rows), keeping
  the reference's calls where anything differs. fp32 heads (MKL sgemm, whose results depend on the weight's strides and the
  output width when threaded) keep the reference's exact calls.

The layouts are rebuilt whenever a parameter of the wrapped head changes (in-place writes bump
its version counter, `.to()` moves its storage), so a head poisoned or reloaded after the rule
was built is scored as it is now (`refresh()` after replacing a parameter object). tests/test_lattice_fast.py compares every path with the
reference on random inputs, fp32 and bf16, ties and NaN rows included.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm_liliprop.heads.lattice import LatticeHead, confidence_features, rank_features


def _mkldnn_bf16_gemm() -> bool:
    try:
        return bool(
            torch.backends.mkldnn.is_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        )
    except (AttributeError, RuntimeError):
        return False


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN at the same places."""
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(a.masked_fill(nan, 0), b.masked_fill(nan, 0))


class _Linear:
    """The outputs of one or more linear layers over the same input, x W_i^T + b_i.

    Unpacked: the reference's `F.linear` calls on the given tensors (one per layer). Packed:
    one oneDNN GEMM over the layers' stacked weights, split again. oneDNN may pick its kernel
    by the number of rows, so the first call with each row count also runs the reference calls
    and keeps the packed GEMM for that row count only if every output is identical.
    """

    __slots__ = ("layers", "packed", "bias", "widths", "verified")

    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor | None]], pack: bool):
        self.layers = layers
        self.widths = [w.shape[0] for w, _ in layers]
        self.packed = self.bias = None
        self.verified: dict[int, bool] = {}
        if pack:
            weight = torch.cat([w for w, _ in layers]) if len(layers) > 1 else layers[0][0]
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)
            biases = [b for _, b in layers]
            if all(b is None for b in biases):
                self.bias = None
            else:
                # A zero bias adds +0.0 to a sum that starts at +0.0: the no-bias output exactly.
                self.bias = torch.cat([
                    torch.zeros(w.shape[0], dtype=w.dtype, device=w.device) if b is None else b
                    for (w, _), b in zip(layers, biases)
                ])

    def reference(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [F.linear(x, w, b) for w, b in self.layers]

    def outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        if self.packed is None or x.numel() == 0:
            return self.reference(x)
        rows = x.numel() // x.shape[-1]
        use = self.verified.get(rows)
        if use is False:
            return self.reference(x)
        y = torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        parts = list(y.split(self.widths, dim=-1)) if len(self.widths) > 1 else [y]
        if use is None:
            expected = self.reference(x)
            self.verified[rows] = all(_same(a, b) for a, b in zip(parts, expected))
            return expected
        return parts

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.outputs(x)[0]


class _Layout:
    """Everything `score` needs from the weights, in the layout it runs on."""

    def __init__(self, head: LatticeHead, pack: bool):
        cfg = head.config
        width = cfg.width
        self.pack = pack

        def lin(module, pack=pack):
            return _Linear([(module.weight.detach(), _detach(module.bias))], pack)

        self.token_proj = None if isinstance(head.token_proj, torch.nn.Identity) else lin(head.token_proj)
        self.pass_hidden_proj = lin(head.pass_hidden_proj)
        self.feature_norm = (head.feature_norm.weight.detach(), head.feature_norm.bias.detach(),
                             head.feature_norm.eps)
        self.feature_up = lin(head.feature_mlp.up_proj)
        self.feature_down = lin(head.feature_mlp.down_proj)
        self.slot_embedding = head.slot_embedding.detach()[:, 0]
        self.rank_embedding = head.rank_embedding.detach()[:, 0]
        self.context_proj = lin(head.context_proj)
        self.layers = [
            (
                _norm(layer.attn_norm),
                _Linear([(layer.attn.in_proj_weight.detach(), layer.attn.in_proj_bias.detach())], pack),
                lin(layer.attn.out_proj),
                _norm(layer.mlp_norm),
                lin(layer.mlp.up_proj),
                lin(layer.mlp.down_proj),
            )
            for layer in head.layers
        ]
        self.output_norm = _norm(head.output_norm)
        self.anchor_norm = _norm(head.anchor_norm)
        w = head.factor_input_proj.weight.detach()
        w_self, w_anchor, w_cross = w.split(width, dim=1)  # the reference's (strided) views
        self.factor_self = _Linear([(w_self, head.factor_input_proj.bias.detach())], pack)
        self.factor_cross = _Linear([(w_cross, None)], pack)
        out_head = (head.out_head.weight.detach(), head.out_head.bias.detach())
        in_head = (head.in_head.weight.detach(), head.in_head.bias.detach())
        anchor_out = (head.anchor_out_head.weight.detach(), head.anchor_out_head.bias.detach())
        # Layers over the same input share one GEMM when packed: the out and in vectors of the
        # nodes; the anchor's factor term and its out vector.
        self.out_in_head = _Linear([out_head, in_head], pack)
        self.anchor_heads = _Linear([(w_anchor, None), anchor_out], pack)
        self.attention_bias: dict[int, torch.Tensor] = {}
        self.rank_features: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


def _detach(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach()


def _norm(module: torch.nn.RMSNorm):
    return module.normalized_shape, module.weight.detach(), module.eps


def _params_key(params: tuple[torch.Tensor, ...]) -> tuple:
    """Changes when a parameter is written in place (version counter) or moved (`.to()`)."""
    return tuple([p._version for p in params] + [p.data_ptr() for p in params])


def _linears(layout: _Layout) -> list[_Linear]:
    found = [layout.pass_hidden_proj, layout.feature_up, layout.feature_down, layout.context_proj,
             layout.factor_self, layout.factor_cross, layout.out_in_head, layout.anchor_heads]
    if layout.token_proj is not None:
        found.append(layout.token_proj)
    for layer in layout.layers:
        found += [layer[1], layer[2], layer[4], layer[5]]
    return found


def packing_matches(head: LatticeHead, generator: torch.Generator | None = None) -> bool:
    """Whether the packed GEMMs of `head` give exactly the reference's linear outputs on
    random probes of 1, 3 and 24 (the served 1 x 3 x 8 lattice) rows. (Each packed GEMM also
    checks itself against the reference the first time it sees a row count.)"""
    packed = _Layout(head, pack=True)
    gen = generator or torch.Generator(device=head.slot_embedding.device).manual_seed(0)
    dtype, device = head.slot_embedding.dtype, head.slot_embedding.device
    for rows in (1, 3, 24):
        for linear in _linears(packed):
            x = torch.randn(1, rows, linear.layers[0][0].shape[1], generator=gen, device=device)
            x = x.to(dtype)
            y = torch.ops.mkldnn._linear_pointwise(x, linear.packed, linear.bias, "none", [], "")
            parts = y.split(linear.widths, dim=-1)
            if not all(_same(a, b) for a, b in zip(parts, linear.reference(x))):
                return False
    return True


class ServingLatticeHead:
    """Inference-only scorer over a `LatticeHead`: `score` returns exactly `head.score`'s
    tensors (same signature, same input checks); call it under `torch.inference_mode`."""

    def __init__(self, head: LatticeHead, pack: bool | None = None):
        self.head = head
        self.config = head.config
        self._pack_option = pack
        self._params: tuple[torch.Tensor, ...] = ()
        self._key: tuple | None = None
        self._layout: _Layout | None = None

    def refresh(self) -> None:
        """Rebuild the layouts on the next call (needed only after a parameter object of the
        head was replaced, e.g. `head.in_head.weight = nn.Parameter(...)`; in-place writes and
        `.to()` are noticed by themselves)."""
        self._layout = None

    @property
    def packed(self) -> bool:
        """Whether the current layout runs the packed oneDNN GEMMs."""
        return self._current().pack

    def _wants_pack(self) -> bool:
        p = self.head.slot_embedding
        can = p.device.type == "cpu" and p.dtype == torch.bfloat16 and _mkldnn_bf16_gemm()
        if self._pack_option is False or not can:
            return False
        return packing_matches(self.head)

    def _current(self) -> _Layout:
        if self._layout is not None and _params_key(self._params) == self._key:
            return self._layout
        with torch.inference_mode(False), torch.no_grad():
            self._params = tuple(self.head.parameters())
            self._layout = _Layout(self.head, self._wants_pack())
        self._key = _params_key(self._params)
        return self._layout

    def _attention_bias(self, layout: _Layout, num_slots: int) -> torch.Tensor:
        bias = layout.attention_bias.get(num_slots)
        if bias is None:
            with torch.no_grad():
                bias = layout.attention_bias[num_slots] = self.head.attention_bias(num_slots)
        return bias

    def _candidate_features(self, layout: _Layout, log_probs: torch.Tensor) -> torch.Tensor:
        k = log_probs.shape[-1]
        constants = layout.rank_features.get(k)
        if constants is None or constants[0].device != log_probs.device:
            constants = layout.rank_features[k] = rank_features(k, log_probs.device)
        return confidence_features(log_probs, *constants)

    def score(
        self,
        token_embeddings: torch.Tensor,
        candidate_log_probs: torch.Tensor,
        pass_hidden: torch.Tensor,
        anchor_hidden: torch.Tensor,
        anchor_valid: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """start [B, K], pairs [B, S-1, K, K] fp32: exactly `LatticeHead.score`'s."""
        head = self.head
        head._check_inputs(
            token_embeddings, candidate_log_probs, pass_hidden, anchor_hidden, anchor_valid
        )
        layout = self._current()
        cfg = self.config
        bsz, n_slots, k = candidate_log_probs.shape
        width = cfg.width
        dtype = head.slot_embedding.dtype

        tokens = token_embeddings.to(dtype)
        if layout.token_proj is not None:
            tokens = layout.token_proj(tokens)
        slot_state = layout.pass_hidden_proj(pass_hidden.to(dtype)).unsqueeze(-2)
        features = self._candidate_features(layout, candidate_log_probs).to(dtype)
        norm_w, norm_b, norm_eps = layout.feature_norm
        features = F.layer_norm(features, (features.shape[-1],), norm_w, norm_b, norm_eps)
        confidence = layout.feature_down(F.silu(layout.feature_up(features)))
        x = tokens + slot_state + confidence
        x = x + layout.slot_embedding[:, :n_slots] + layout.rank_embedding
        x = x.reshape(bsz, n_slots * k, width)

        attn_bias = self._attention_bias(layout, n_slots)
        heads = cfg.num_heads
        head_shape = (bsz, n_slots * k, heads, width // heads)
        for attn_norm, qkv_proj, out_proj, mlp_norm, up_proj, down_proj in layout.layers:
            h = F.rms_norm(x, attn_norm[0], attn_norm[1], attn_norm[2])
            q, kk, v = qkv_proj(h).chunk(3, dim=-1)
            q, kk, v = (t.view(head_shape).transpose(1, 2) for t in (q, kk, v))
            y = F.scaled_dot_product_attention(q, kk, v, attn_mask=attn_bias)
            x = x + out_proj(y.transpose(1, 2).reshape(bsz, n_slots * k, width))
            h = F.rms_norm(x, mlp_norm[0], mlp_norm[1], mlp_norm[2])
            x = x + down_proj(F.silu(up_proj(h)))
        norm = layout.output_norm
        x = F.rms_norm(x, norm[0], norm[1], norm[2]).reshape(bsz, n_slots, k, width)

        anchor = layout.context_proj(anchor_hidden.to(dtype)) * anchor_valid[:, None].to(dtype)
        norm = layout.anchor_norm
        anchor = F.rms_norm(anchor, norm[0], norm[1], norm[2])

        a = anchor[:, None, None, :]
        if layout.anchor_heads.packed is None:  # the reference's calls, shapes included
            (w_anchor, _), (w_out, b_out) = layout.anchor_heads.layers
            anchor_term, anchor_out = F.linear(a, w_anchor), F.linear(anchor, w_out, b_out)
        else:
            anchor_term, anchor_out = layout.anchor_heads.outputs(anchor)
            anchor_term = anchor_term[:, None, None, :]
        fused = layout.factor_self(x) + anchor_term
        fused = F.silu(fused + layout.factor_cross(x * a))

        eps = cfg.vector_eps
        out_vec, in_vec = (F.normalize(v, dim=-1, eps=eps) for v in layout.out_in_head.outputs(fused))
        anchor_out = F.normalize(anchor_out, dim=-1, eps=eps)

        start = (anchor_out[:, None, :] * in_vec[:, 0]).sum(dim=-1)
        pairs = torch.matmul(out_vec[:, :-1], in_vec[:, 1:].transpose(-1, -2))
        return cfg.logit_scale * start.float(), cfg.logit_scale * pairs.float()

    __call__ = score
