"""The training drafter must compute what vLLM's DFlash proposer computes at serving time."""

import math

import pytest
import torch

from training.drafter import (
    DFlashDrafter,
    DrafterConfig,
    block_attention_mask,
    default_target_layer_ids,
)
from vllm_liliprop.checkpoints import dflash_weight_shapes


def tiny_config(**overrides) -> DrafterConfig:
    base = dict(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, target_layer_ids=[0, 2],
        mask_token_id=96, block_size=4, rope_theta=10000.0,
    )
    base.update(overrides)
    return DrafterConfig(**base)


def test_state_dict_is_the_dflash_checkpoint_layout():
    """What the exporter writes (the drafter's state dict) is the layout the runtime names and
    the test fixtures build from."""
    cfg = tiny_config()
    own = {name: tuple(t.shape) for name, t in DFlashDrafter(cfg).state_dict().items()}
    assert own == dflash_weight_shapes(cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers,
                                       cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                                       cfg.num_taps)


def rms(x, weight, eps):
    return weight * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def rotate(x, positions, theta):
    """RoPE written out pairwise: dims i and i + d/2 rotate by position * theta^(-2i/d)."""
    d = x.shape[-1]
    out = x.clone()
    for i in range(d // 2):
        angle = positions.double() * theta ** (-2 * i / d)
        c, s = torch.cos(angle).float(), torch.sin(angle).float()
        a, b = x[..., i], x[..., i + d // 2]
        out[..., i] = a * c - b * s
        out[..., i + d // 2] = b * c + a * s
    return out


def serve_one_block(drafter, embed, lm_head, taps, tokens, anchor):
    """What the V1 DFlash proposer does for one request whose last verified token is at
    anchor - 1: context = every position < anchor, query = [tokens[anchor], mask, ...] at
    positions anchor.., attention over [context; block] without any mask."""
    cfg = drafter.config
    sd = {k: v.detach() for k, v in drafter.state_dict().items()}
    eps, hd = cfg.rms_norm_eps, cfg.head_dim
    ctx = rms(taps[:anchor] @ sd["fc.weight"].T, sd["hidden_norm.weight"], eps)
    ids = torch.tensor([int(tokens[anchor])] + [cfg.mask_token_id] * (cfg.block_size - 1))
    x = embed[ids]
    q_pos = anchor + torch.arange(cfg.block_size)
    c_pos = torch.arange(anchor)
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        h = rms(x, sd[p + "input_layernorm.weight"], eps)
        heads = []
        for head in range(cfg.num_attention_heads):
            kvh = head // group
            wq = sd[p + "self_attn.q_proj.weight"][head * hd:(head + 1) * hd]
            wk = sd[p + "self_attn.k_proj.weight"][kvh * hd:(kvh + 1) * hd]
            wv = sd[p + "self_attn.v_proj.weight"][kvh * hd:(kvh + 1) * hd]
            q = rotate(rms(h @ wq.T, sd[p + "self_attn.q_norm.weight"], eps), q_pos, cfg.rope_theta)
            k_ctx = rotate(rms(ctx @ wk.T, sd[p + "self_attn.k_norm.weight"], eps), c_pos, cfg.rope_theta)
            k_blk = rotate(rms(h @ wk.T, sd[p + "self_attn.k_norm.weight"], eps), q_pos, cfg.rope_theta)
            keys = torch.cat([k_ctx, k_blk])
            values = torch.cat([ctx @ wv.T, h @ wv.T])
            weights = torch.softmax(q @ keys.T / math.sqrt(hd), dim=-1)
            heads.append(weights @ values)
        x = x + torch.cat(heads, dim=-1) @ sd[p + "self_attn.o_proj.weight"].T
        h = rms(x, sd[p + "post_attention_layernorm.weight"], eps)
        gate = h @ sd[p + "mlp.gate_proj.weight"].T
        up = h @ sd[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ sd[p + "mlp.down_proj.weight"].T
    return rms(x, sd["norm.weight"], eps) @ lm_head.T


def test_state_dict_names_are_vllm_dflash_checkpoint_names():
    cfg = tiny_config()
    names = set(DFlashDrafter(cfg).state_dict())
    expected = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    for i in range(cfg.num_hidden_layers):
        for part in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
            expected.add(f"layers.{i}.self_attn.{part}.weight")
        for part in ("gate_proj", "up_proj", "down_proj"):
            expected.add(f"layers.{i}.mlp.{part}.weight")
        expected |= {f"layers.{i}.input_layernorm.weight", f"layers.{i}.post_attention_layernorm.weight"}
    assert names == expected
    assert DFlashDrafter(cfg).state_dict()["fc.weight"].shape == (64, 128)


def test_batched_training_forward_equals_step_by_step_serving_reference():
    torch.manual_seed(0)
    cfg = tiny_config()
    drafter = DFlashDrafter(cfg)
    with torch.no_grad():  # non-trivial norm weights so every norm is exercised
        for name, param in drafter.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size)
    lm_head = torch.randn(cfg.vocab_size, cfg.hidden_size) * 0.1
    seq_len = 11
    tokens = torch.randint(0, 90, (2, seq_len))
    taps = torch.randn(2, seq_len, cfg.hidden_size * cfg.num_taps)
    anchors = torch.tensor([[1, 5, 9], [3, 4, 10]])  # blocks may overlap and run past the end

    block_ids = torch.full((2, 3, cfg.block_size), cfg.mask_token_id)
    block_ids[:, :, 0] = tokens.gather(1, anchors)
    context = drafter.context_states(taps)
    hidden = drafter(embed[block_ids], context, anchors)
    logits = hidden @ lm_head.T

    for b in range(2):
        for n in range(3):
            reference = serve_one_block(drafter, embed, lm_head, taps[b], tokens[b], int(anchors[b, n]))
            torch.testing.assert_close(logits[b, n], reference, rtol=1e-4, atol=1e-4)


def test_block_mask_sees_context_strictly_before_anchor_and_own_block():
    mask = block_attention_mask(torch.tensor([[2, 3]]), context_len=5, block_size=2)
    assert mask.shape == (1, 4, 9)
    rows = mask[0].int().tolist()
    #         ctx 0..4        block0 block1
    assert rows[0] == [1, 1, 0, 0, 0, 1, 1, 0, 0]
    assert rows[1] == [1, 1, 0, 0, 0, 1, 1, 0, 0]
    assert rows[2] == [1, 1, 1, 0, 0, 0, 0, 1, 1]


@pytest.mark.slow
def test_rope_and_norm_match_vllm_native_ops():
    pytest.importorskip("vllm")
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.layernorm import RMSNorm as VllmRMSNorm
    from vllm.model_executor.layers.rotary_embedding import get_rope

    from training.drafter import RMSNorm, _apply_rope, rope_cos_sin

    torch.manual_seed(0)
    hd, heads, theta = 32, 3, 1_000_000.0
    positions = torch.tensor([0, 1, 7, 300, 4095])
    q = torch.randn(5, heads * hd)
    k = torch.randn(5, heads * hd)
    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(hd, max_position=8192, is_neox_style=True,
                        rope_parameters={"rope_type": "default", "rope_theta": theta})
        norm = VllmRMSNorm(64, eps=1e-6)
    vq, vk = rope.forward_native(positions, q.clone(), k.clone())
    cos, sin = rope_cos_sin(positions, hd, theta)
    ours = _apply_rope(q.view(5, heads, hd), cos, sin).reshape(5, -1)
    torch.testing.assert_close(ours, vq, rtol=1e-5, atol=1e-5)

    ours_norm = RMSNorm(64, 1e-6)
    with torch.no_grad():
        w = torch.rand(64) + 0.5
        norm.weight.copy_(w)
        ours_norm.weight.copy_(w)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    torch.testing.assert_close(ours_norm.to(torch.bfloat16)(x), norm.to(torch.bfloat16).forward_native(x))


def test_config_validation_and_hf_round_trip():
    cfg = tiny_config()
    hf = cfg.to_hf_dict()
    assert hf["architectures"] == ["DFlashDraftModel"] and hf["model_type"] == "qwen3"
    assert hf["dflash_config"] == {"mask_token_id": 96, "target_layer_ids": [0, 2], "block_size": 4}
    assert DrafterConfig.from_hf_dict(hf) == cfg
    with pytest.raises(ValueError, match="target_layer_ids"):
        tiny_config(target_layer_ids=[2, 0])
    with pytest.raises(ValueError, match="mask_token_id"):
        tiny_config(mask_token_id=97)
    with pytest.raises(ValueError, match="target_taps"):
        DFlashDrafter(cfg).context_states(torch.zeros(1, 3, 64))
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(4, 2) == [0, 3]
