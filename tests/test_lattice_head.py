"""LiLiCorr lattice head: config validation, parity with upstream vLLM's LiLiCorrHead, training
use, and top-K candidate extraction."""

import math

import pytest
import torch

from vllm_liliprop.heads import LatticeConfig, LatticeHead, topk_candidates

TINY_FIELDS = dict(
    lilicorr_candidate_topk=4,
    lilicorr_hidden_size=16,
    lilicorr_num_layers=2,
    lilicorr_num_heads=2,
    lilicorr_mlp_ratio=2.0,
    lilicorr_factor_dim=8,
    lilicorr_vector_eps=1e-6,
    lilicorr_logit_scale=8.0,
)


def tiny_config(model_hidden_size=24, block_size=5, **overrides):
    fields = {**TINY_FIELDS, **overrides}
    return LatticeConfig.from_dflash_config(fields, model_hidden_size, block_size, 1e-6)


def lattice_inputs(config, bsz, num_slots, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    k, hm = config.candidate_topk, config.model_hidden_size
    logits = torch.randn(bsz * num_slots, 50, generator=g) * 3
    _, log_probs = topk_candidates(logits, k)
    return dict(
        token_embeddings=torch.randn(bsz, num_slots, k, hm, generator=g).to(dtype),
        candidate_log_probs=log_probs.view(bsz, num_slots, k),
        pass_hidden=torch.randn(bsz, num_slots, hm, generator=g).to(dtype),
        anchor_hidden=torch.randn(bsz, hm, generator=g).to(dtype),
        anchor_valid=torch.arange(bsz) % 3 != 1,
    )


def randomize(module, seed):
    """Nonzero values in every parameter (biases and attention biases included)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32) * 0.3
            p.copy_(1.0 + noise if name.endswith("norm.weight") else noise)


# --- config -----------------------------------------------------------------------------------


def test_config_round_trips_through_dflash_config():
    config = tiny_config()
    exported = config.to_dflash_config()
    assert exported["lilicorr_enabled"] is True
    assert set(exported) == {"lilicorr_enabled", *TINY_FIELDS}
    again = LatticeConfig.from_dflash_config({**exported, "block_size": 5}, 24, 5, 1e-6)
    assert again == config
    assert config.width == 16 and config.num_slots == 4 and config.mlp_hidden_size == 32


def test_zero_hidden_size_means_draft_width():
    config = tiny_config(lilicorr_hidden_size=0)
    assert config.width == 24 and config.to_dflash_config()["lilicorr_hidden_size"] == 0
    assert isinstance(LatticeHead(config).token_proj, torch.nn.Identity)


@pytest.mark.parametrize(
    "field,value",
    [
        ("candidate_topk", 3),
        ("candidate_topk", 32),
        ("candidate_topk", 0),
        ("candidate_topk", "8"),
        ("candidate_topk", True),
        ("candidate_topk", 8.0),
        ("hidden_size", -1),
        ("hidden_size", 16.5),
        ("num_layers", -1),
        ("num_layers", None),
        ("num_heads", 0),
        ("num_heads", 3),  # does not divide the width 16
        ("mlp_ratio", 0.0),
        ("mlp_ratio", float("nan")),
        ("mlp_ratio", "2"),
        ("factor_dim", 0),
        ("vector_eps", 0.0),
        ("vector_eps", float("inf")),
        ("logit_scale", -8.0),
        ("logit_scale", "8"),
    ],
)
def test_bad_field_raises_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"dflash_config.lilicorr_{field} = "):
        tiny_config(**{f"lilicorr_{field}": value})


@pytest.mark.parametrize("field", [f.removeprefix("lilicorr_") for f in TINY_FIELDS])
def test_missing_field_raises_naming_the_field(field):
    fields = {k: v for k, v in TINY_FIELDS.items() if k != f"lilicorr_{field}"}
    with pytest.raises(ValueError, match=f"dflash_config.lilicorr_{field} missing"):
        LatticeConfig.from_dflash_config(fields, 24, 5, 1e-6)


def test_bad_geometry_and_disabled_head_raise():
    with pytest.raises(ValueError, match="block_size"):
        tiny_config(block_size=1)
    with pytest.raises(ValueError, match="model_hidden_size"):
        tiny_config(model_hidden_size=0)
    with pytest.raises(ValueError, match="rms_norm_eps"):
        LatticeConfig.from_dflash_config(TINY_FIELDS, 24, 5, 0.0)
    with pytest.raises(ValueError, match="lilicorr_enabled"):
        LatticeConfig.from_dflash_config({**TINY_FIELDS, "lilicorr_enabled": False}, 24, 5, 1e-6)


def test_paper_head_sizes_match_table_4():
    # Table 4: 36.76M parameters for the Qwen3-8B target (width 4096), 32.04M for 4B (2560).
    fields = dict(
        lilicorr_candidate_topk=8, lilicorr_hidden_size=1024, lilicorr_num_layers=2,
        lilicorr_num_heads=8, lilicorr_mlp_ratio=2.0, lilicorr_factor_dim=1024,
        lilicorr_vector_eps=1e-6, lilicorr_logit_scale=8.0,
    )
    for model_width, millions in ((4096, 36.76), (2560, 32.04)):
        with torch.device("meta"):
            head = LatticeHead(LatticeConfig.from_dflash_config(fields, model_width, 16, 1e-6))
        assert round(sum(p.numel() for p in head.parameters()) / 1e6, 2) == millions


# --- head behaviour ---------------------------------------------------------------------------


def test_score_shapes_dtypes_and_input_checks():
    config = tiny_config()
    head = LatticeHead(config)
    for num_slots in (1, 2, 4):
        start, pairs = head.score(**lattice_inputs(config, 3, num_slots, seed=num_slots))
        assert start.shape == (3, 4) and pairs.shape == (3, num_slots - 1, 4, 4)
        assert start.dtype == pairs.dtype == torch.float32
        assert (start.abs() <= 8.0 + 1e-4).all() and (pairs.abs() <= 8.0 + 1e-4).all()  # 8 * cosine
    with pytest.raises(ValueError, match="S = 5 slots"):
        head.score(**lattice_inputs(config, 2, 5, seed=0))
    wrong_k = lattice_inputs(tiny_config(lilicorr_candidate_topk=2), 2, 3, seed=0)
    with pytest.raises(ValueError, match="K = 2"):
        head.score(**wrong_k)
    bad = lattice_inputs(config, 2, 3, seed=0)
    bad["pass_hidden"] = bad["pass_hidden"][:, :2]
    with pytest.raises(ValueError, match="pass_hidden"):
        head.score(**bad)


def test_shorter_draft_uses_the_learned_slot_prefix():
    # Without attention layers nothing mixes slots, so scoring the first S slots alone must
    # reproduce the full lattice's first S slots: slot s keeps slot_embedding[s].
    config = tiny_config(lilicorr_num_layers=0)
    head = LatticeHead(config)
    randomize(head, seed=4)
    full = lattice_inputs(config, 2, 4, seed=8)
    per_slot = ("token_embeddings", "candidate_log_probs", "pass_hidden")
    prefix = {k: (v[:, :2] if k in per_slot else v) for k, v in full.items()}
    start_full, pairs_full = head.score(**full)
    start, pairs = head.score(**prefix)
    assert torch.allclose(start, start_full, atol=1e-6)
    assert torch.allclose(pairs, pairs_full[:, :1], atol=1e-6)


def test_init_weights_is_seeded_and_invalid_anchor_gives_flat_start():
    config = tiny_config()
    a, b = LatticeHead(config), LatticeHead(config)
    a.init_weights(torch.Generator().manual_seed(5))
    b.init_weights(torch.Generator().manual_seed(5))
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(pa, pb), name
    inputs = lattice_inputs(config, 3, 3, seed=1)
    start, _ = a.score(**inputs)
    assert torch.equal(start[~inputs["anchor_valid"]], torch.zeros(1, 4))
    assert start[inputs["anchor_valid"]].abs().sum() > 0


def test_meta_built_head_loads_a_checkpoint_and_scores_the_same():
    # The serving path may build the head without memory, then fill it from a checkpoint.
    config = tiny_config()
    source = LatticeHead(config)
    randomize(source, seed=14)
    with torch.device("meta"):
        head = LatticeHead(config)
    head = head.to_empty(device="cpu")
    head.load_state_dict(source.state_dict(), strict=True)
    inputs = lattice_inputs(config, 2, 4, seed=15)
    for got, want in zip(head.score(**inputs), source.score(**inputs)):
        assert torch.equal(got, want)


def test_score_is_differentiable_and_matches_under_inference_mode():
    config = tiny_config()
    head = LatticeHead(config)
    randomize(head, seed=2)
    inputs = lattice_inputs(config, 2, 3, seed=3)
    for name in ("token_embeddings", "candidate_log_probs", "pass_hidden", "anchor_hidden"):
        inputs[name].requires_grad_(True)
    start, pairs = head.score(**inputs)
    (start.square().sum() + pairs.logsumexp(-1).sum()).backward()
    for name, p in head.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    for name in ("token_embeddings", "candidate_log_probs", "pass_hidden", "anchor_hidden"):
        assert inputs[name].grad.abs().sum() > 0, name

    with torch.inference_mode():
        start_inf, pairs_inf = head.score(**{k: v.detach() for k, v in inputs.items()})
    # Autograd may route attention through a different kernel: equal up to rounding.
    torch.testing.assert_close(start_inf, start.detach(), atol=1e-5, rtol=0)
    torch.testing.assert_close(pairs_inf, pairs.detach(), atol=1e-5, rtol=0)


def test_gradients_match_finite_differences():
    config = tiny_config(
        model_hidden_size=8, block_size=3, lilicorr_hidden_size=8, lilicorr_factor_dim=4,
        lilicorr_num_layers=1, lilicorr_candidate_topk=2,
    )
    head = LatticeHead(config).double()
    randomize(head, seed=6)
    inputs = lattice_inputs(config, 1, 2, seed=7, dtype=torch.float64)
    inputs["candidate_log_probs"] = inputs["candidate_log_probs"].double()

    def scores(log_probs, pass_hidden):
        changed = {"candidate_log_probs": log_probs, "pass_hidden": pass_hidden}
        start, pairs = head.score(**{**inputs, **changed})
        return start.double(), pairs.double()

    # score() returns fp32, so compare against finite differences at fp32 precision.
    log_probs = inputs["candidate_log_probs"].clone().requires_grad_(True)
    pass_hidden = inputs["pass_hidden"].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(
        scores, (log_probs, pass_hidden), eps=1e-3, atol=2e-3, rtol=1e-2
    )


def test_bfloat16_head_tracks_fp32_head():
    config = tiny_config()
    head = LatticeHead(config)
    randomize(head, seed=9)
    inputs = lattice_inputs(config, 2, 4, seed=10)
    start, pairs = head.score(**inputs)
    start_bf, pairs_bf = head.to(torch.bfloat16).score(**inputs)
    assert start_bf.dtype == torch.float32
    assert (start_bf - start).abs().max() < 0.3 and (pairs_bf - pairs).abs().max() < 0.3


# --- parity with upstream vLLM ----------------------------------------------------------------


@pytest.fixture(scope="module")
def build_upstream_head(tmp_path_factory):
    """Construct vLLM's own LiLiCorrHead on CPU.

    Its ReplicatedLinear / ColumnParallelLinear layers ask the tensor-parallel group for their
    rank at construction, so a one-process gloo group is set up (and torn down if created
    here). `_cpu_skip_gemm_dispatch` makes vLLM's CPU linear method use plain F.linear rather
    than repacking the weights, so they stay loadable and comparable.
    """
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state
    from vllm.model_executor.models.lilicorr import LiLiCorrHead

    vllm_config = VllmConfig()
    created_group = not parallel_state.model_parallel_is_initialized()
    if created_group:
        init_file = tmp_path_factory.mktemp("dist") / "init"
        with set_current_vllm_config(vllm_config):
            parallel_state.init_distributed_environment(
                world_size=1, rank=0, local_rank=0, backend="gloo",
                distributed_init_method=f"file://{init_file}",
            )
            parallel_state.ensure_model_parallel_initialized(1, 1)

    def build(config: LatticeConfig) -> torch.nn.Module:
        with set_current_vllm_config(vllm_config):
            head = LiLiCorrHead(
                model_hidden_size=config.model_hidden_size,
                block_size=config.block_size,
                rms_norm_eps=config.rms_norm_eps,
                config=config.to_dflash_config(),
            )
        for module in head.modules():
            if getattr(module, "quant_method", None) is not None:
                module._cpu_skip_gemm_dispatch = True
                module.quant_method.process_weights_after_loading(module)
        return head

    yield build
    if created_group:
        parallel_state.destroy_model_parallel()
        parallel_state.destroy_distributed_environment()


def upstream_scores(head, config, inputs):
    head.materialize_inference_buffers(torch.device("cpu"), head.slot_embedding.dtype)
    with torch.no_grad():
        start, pairs = head.score(**inputs)
    return config.logit_scale * start.float(), config.logit_scale * pairs.float()


@pytest.mark.slow  # importing vLLM takes ~15 s
@pytest.mark.parametrize("hidden_size", [16, 0])  # with and without token_proj
def test_state_dict_names_and_shapes_equal_upstream(build_upstream_head, hidden_size):
    config = tiny_config(lilicorr_hidden_size=hidden_size)
    ours = LatticeHead(config).state_dict()
    theirs = build_upstream_head(config).state_dict()
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}
    assert ("token_proj.weight" in ours) == (hidden_size != 0)


@pytest.mark.slow
@pytest.mark.parametrize("hidden_size", [16, 0])
def test_scores_match_upstream(build_upstream_head, hidden_size):
    config = tiny_config(lilicorr_hidden_size=hidden_size)
    upstream = build_upstream_head(config)
    randomize(upstream, seed=11)
    ours = LatticeHead(config)
    ours.load_state_dict(upstream.state_dict(), strict=True)
    ours.eval()
    for num_slots in (4, 3, 1):  # the full block_size - 1 and shorter learned prefixes
        inputs = lattice_inputs(config, 5, num_slots, seed=20 + num_slots)
        start, pairs = ours.score(**inputs)
        ref_start, ref_pairs = upstream_scores(upstream, config, inputs)
        assert start.shape == ref_start.shape and pairs.shape == ref_pairs.shape
        torch.testing.assert_close(start, ref_start, atol=1e-5, rtol=0)
        torch.testing.assert_close(pairs, ref_pairs, atol=1e-5, rtol=0)
        assert not torch.allclose(start[0], start[1])  # inputs and anchors really differ


@pytest.mark.slow
def test_exported_weights_load_upstream_and_score_the_same(build_upstream_head):
    config = tiny_config(block_size=4, lilicorr_candidate_topk=8)
    ours = LatticeHead(config)
    ours.init_weights(torch.Generator().manual_seed(12))
    with torch.no_grad():  # our init leaves biases at zero; make the check cover them too
        for p in ours.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.1)
    upstream = build_upstream_head(config)
    upstream.load_state_dict(ours.state_dict(), strict=True)
    inputs = lattice_inputs(config, 3, 3, seed=13)
    start, pairs = ours.score(**inputs)
    ref_start, ref_pairs = upstream_scores(upstream, config, inputs)
    torch.testing.assert_close(start, ref_start, atol=1e-5, rtol=0)
    torch.testing.assert_close(pairs, ref_pairs, atol=1e-5, rtol=0)


# --- candidates -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_topk_candidates_match_stable_sorted_log_softmax(dtype):
    # bf16 logits are full of exact ties; a stable descending sort is the reference order.
    logits = (torch.randn(6, 300, generator=torch.Generator().manual_seed(0)) * 4).to(dtype)
    ids, log_probs = topk_candidates(logits, 8)
    ref_log_probs = torch.log_softmax(logits.float(), dim=-1)
    ref_values, ref_ids = torch.sort(ref_log_probs, dim=-1, descending=True, stable=True)
    assert ids.dtype == torch.int64 and log_probs.dtype == torch.float32
    assert torch.equal(ids, ref_ids[:, :8])
    torch.testing.assert_close(log_probs, ref_values[:, :8], atol=1e-6, rtol=0)


def test_topk_candidates_ties_go_to_lowest_token_id():
    logits = torch.tensor(
        [
            [1.0, 3.0, 3.0, 2.0, 3.0, 0.0],  # a three-way tie at the top
            [5.0, 5.0, 5.0, 5.0, 5.0, 5.0],  # all equal
            [0.0, 2.0, 1.0, 2.0, 1.0, 1.0],  # tie straddling the K-th place
        ]
    )
    ids, log_probs = topk_candidates(logits, 4)
    assert ids.tolist() == [[1, 2, 4, 3], [0, 1, 2, 3], [1, 3, 2, 4]]
    assert math.isclose(log_probs[1, 0].item(), -math.log(6), rel_tol=1e-6)
    # The rule follows token ids, not input order: reversed, the lowest new ids win the ties.
    ids_flipped, _ = topk_candidates(logits.flip(-1), 4)
    assert ids_flipped.tolist() == [[1, 3, 4, 2], [0, 1, 2, 3], [2, 4, 0, 1]]


def test_topk_candidates_bad_input():
    with pytest.raises(ValueError, match="k = 7"):
        topk_candidates(torch.zeros(2, 6), 7)
    with pytest.raises(ValueError, match="logits"):
        topk_candidates(torch.zeros(6), 2)
