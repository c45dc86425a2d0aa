"""The LiLiCorr serving path against the path as first written: bit-identical candidates, scores,
fault flags and drafts on random inputs (ties, several batch rows, fp32 and bf16, NaN/inf rows).

References: `topk_candidates_reference`, `LatticeHead.score`, `walk_faults_reference` and
`LatticeRule(..., reference=True)`; tools/lattice_cpu_bench.py times the same pairs.
"""

import math
import zlib

import pytest
import torch

from vllm_liliprop.heads.candidates import (
    topk_candidates,
    topk_candidates_fast,
    topk_candidates_reference,
)
from vllm_liliprop.heads.dels import GRUShortHead, MarkovShortHead, UnigramPrior
from vllm_liliprop.heads.lattice import LatticeConfig, LatticeHead
from vllm_liliprop.heads.lattice_serving import ServingLatticeHead, packing_matches
from vllm_liliprop.rules.base import DraftInputs
from vllm_liliprop.rules.lattice import LatticeRule, walk_faults, walk_faults_reference
from vllm_liliprop.rules.lattice_dels import LatticeDelsRule
from vllm_liliprop.walks import greedy_walk, viterbi_walk

NAN, INF = math.nan, math.inf


def same(a, b):
    """Equal values, dtype and shape, NaN where the other has NaN."""
    assert a.dtype == b.dtype and a.shape == b.shape
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


# ---------------------------------------------------------------- top-K candidates


def _logits(g, n, vocab, kind, dtype):
    x = torch.randn(n, vocab, generator=g) * 3
    if kind == "ties":
        x = (x * 2).round() / 2  # few distinct values: tie groups straddle rank K and 2K
    elif kind == "flat-top":
        x[:, : vocab // 2] = 4.0
    x = x.to(dtype)
    if kind == "faults" and n >= 3:
        x[0, vocab // 2] = NAN
        x[1] = -INF
        x[2, 3 % vocab] = INF  # vocab may be as small as 2
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["plain", "ties", "flat-top", "faults"])
def test_fast_topk_equals_reference(dtype, kind):
    # crc32, not hash(): str hashes change with PYTHONHASHSEED, so a failure would not replay
    g = torch.Generator().manual_seed(zlib.crc32(f"{dtype}-{kind}".encode()))
    for trial in range(15):
        n = int(torch.randint(1, 25, (1,), generator=g))
        vocab = int(torch.randint(2, 700, (1,), generator=g))
        k = min([1, 2, 4, 8, 16][trial % 5], vocab)
        x = _logits(g, n, vocab, kind, dtype)
        fast, ref = topk_candidates_fast(x, k), topk_candidates_reference(x, k)
        same(fast[0], ref[0])
        same(fast[1], ref[1])
        same(topk_candidates(x, k)[0], ref[0])


def test_fast_topk_equals_reference_at_the_served_vocabulary():
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(24, 49152, generator=g) * 3).bfloat16()  # bf16: exact ties near the top
    for k in (8, 16):
        fast, ref = topk_candidates_fast(x, k), topk_candidates_reference(x, k)
        same(fast[0], ref[0])
        same(fast[1], ref[1])


def test_fast_topk_keeps_the_tie_rule():
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, 0.0, 3.0, 3.0, 3.0, 3.0, 3.0]])
    ids, _ = topk_candidates_fast(logits, 2)  # the tie group runs past rank 2K: reference
    assert ids.tolist() == [[1, 2]]
    ids, _ = topk_candidates_fast(torch.tensor([[0.0, 2.0, 1.0, 2.0, 1.0, 1.0, -1.0, -2.0, -3.0]]), 4)
    assert ids.tolist() == [[1, 3, 2, 4]]


# ---------------------------------------------------------------- the head


def _config(hm=24, width=0, block=6, k=4, layers=2, heads=2, factor=8):
    return LatticeConfig(
        model_hidden_size=hm, block_size=block, rms_norm_eps=1e-6, candidate_topk=k,
        hidden_size=width, num_layers=layers, num_heads=heads, mlp_ratio=2.0,
        factor_dim=factor, vector_eps=1e-6, logit_scale=8.0,
    )


def _head(config, dtype, seed=0):
    head = LatticeHead(config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            noise = torch.randn(p.shape, generator=g) * 0.3
            p.copy_(1.0 + noise if name.endswith("norm.weight") else noise)
    return head.to(dtype).eval()


def _head_inputs(config, bsz, num_slots, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    k, hm = config.candidate_topk, config.model_hidden_size
    logits = (torch.randn(bsz * num_slots, 64, generator=g) * 3).to(dtype)
    _, log_probs = topk_candidates_reference(logits, k)
    return (
        torch.randn(bsz, num_slots, k, hm, generator=g).to(dtype),
        log_probs.view(bsz, num_slots, k),
        torch.randn(bsz, num_slots, hm, generator=g).to(dtype),
        torch.randn(bsz, hm, generator=g).to(dtype),
        torch.arange(bsz) % 3 != 1,
    )


CONFIGS = {
    "tiny": _config(),
    "projected-width": _config(hm=24, width=16, heads=4),
    "k1-one-layer": _config(k=1, layers=1),
    "k8-no-layers": _config(k=8, layers=0),
    "served-shape": _config(hm=576, block=8, k=8, heads=8, factor=256),
}


@pytest.mark.parametrize("pack", [None, False], ids=["auto", "unpacked"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", CONFIGS)
def test_serving_head_scores_equal_the_reference(name, dtype, pack):
    config = CONFIGS[name]
    head = _head(config, dtype)
    serving = ServingLatticeHead(head, pack=pack)
    with torch.inference_mode():
        for bsz, slots in ((1, config.num_slots), (3, 1), (8, min(3, config.num_slots)), (2, 2)):
            if slots > config.num_slots:
                continue
            args = _head_inputs(config, bsz, slots, dtype, seed=bsz * 10 + slots)
            ref = head.score(*args)
            ours = serving.score(*args)
            same(ours[0], ref[0])
            same(ours[1], ref[1])
    if pack is False or dtype == torch.float32:
        assert not serving.packed


def test_bf16_serving_head_packs_when_the_cpu_has_a_bf16_gemm():
    head = _head(CONFIGS["served-shape"], torch.bfloat16)
    serving = ServingLatticeHead(head)
    try:
        supported = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        supported = False
    assert serving.packed == (supported and packing_matches(head))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_serving_head_follows_in_place_weight_changes(dtype):
    """A NaN written into the head after the serving layout was built reaches the scores."""
    config = CONFIGS["tiny"]
    head = _head(config, dtype)
    serving = ServingLatticeHead(head)
    args = _head_inputs(config, 3, 3, dtype)
    with torch.inference_mode():
        serving.score(*args)
    with torch.no_grad():
        head.in_head.weight[0, 0] = NAN
        head.slot_embedding.mul_(2.0)
    with torch.inference_mode():
        ref, ours = head.score(*args), serving.score(*args)
    assert torch.isnan(ref[1]).any()
    same(ours[0], ref[0])
    same(ours[1], ref[1])


def test_serving_head_keeps_the_input_checks():
    config = CONFIGS["tiny"]
    serving = ServingLatticeHead(_head(config, torch.float32))
    args = list(_head_inputs(config, 2, 3, torch.float32))
    args[2] = args[2][:, :2]
    with pytest.raises(ValueError, match="pass_hidden"):
        serving.score(*args)


# ---------------------------------------------------------------- walk faults


def test_walk_faults_equal_the_float64_path_score_test():
    g = torch.Generator().manual_seed(5)
    for trial in range(60):
        bsz, slots, k = int(torch.randint(1, 9, (1,), generator=g)), 1 + trial % 6, [1, 2, 4, 8][trial % 4]
        start = torch.randn(bsz, k, generator=g) * 4
        pairs = torch.randn(bsz, slots - 1, k, k, generator=g) * 4
        for tensor in (start, pairs):
            flat = tensor.view(-1)
            for value in (NAN, INF, -INF, -INF, 3e38):
                if flat.numel() and torch.rand(1, generator=g) < 0.3:
                    flat[int(torch.randint(0, flat.numel(), (1,), generator=g))] = value
        if trial % 9 == 0:
            pairs.fill_(-INF)
        for index in (greedy_walk(start, pairs), viterbi_walk(start, pairs),
                      torch.randint(0, k, (bsz, slots), generator=g)):
            assert torch.equal(walk_faults(start, pairs, index), walk_faults_reference(start, pairs, index))


# ---------------------------------------------------------------- whole rules

V, H = 300, 24


def _draft_inputs(config, bsz, slots, dtype, seed, edit=None, temperature=None):
    g = torch.Generator().manual_seed(seed)
    lm_head = torch.randn(V, H, generator=g).to(dtype)
    embed = torch.nn.Embedding(V, H).to(dtype)
    with torch.no_grad():
        embed.weight.copy_(torch.randn(V, H, generator=g))

    def compute_logits(hidden):
        logits = hidden @ lm_head.T
        if seed % 2:
            logits = (logits * 2).round() / 2  # many exact ties among candidates
        if edit is not None:
            edit(logits.view(bsz, slots, V))
        return logits

    return DraftInputs(
        hidden=torch.randn(bsz, slots, H, generator=g).to(dtype),
        anchor_ids=torch.randint(0, V, (bsz,), generator=g),
        compute_logits=compute_logits,
        embed=embed,
        anchor_hidden=torch.randn(bsz, H, generator=g).to(dtype),
        anchor_valid=torch.arange(bsz) % 3 != 2,
        temperature=temperature,
    )


def _faults(logits):
    if logits.shape[0] >= 3:
        logits[0, -1, 5] = NAN
        logits[1, 0] = -INF
        logits[2, -1, 0] = INF


def _rules(dtype, reference):
    config = _config(hm=H, block=6, k=4)

    def lattice_head():
        return _head(config, dtype, seed=1)

    w = [0.3] * 5
    prior = UnigramPrior.from_counts(torch.arange(V) % 7).log_probs.clone()
    torch.manual_seed(2)
    markov = MarkovShortHead(V, 4).eval()
    gru = GRUShortHead(torch.randn(V, 8), hidden_size=12, rank=4).eval()
    for walk, sampling in (("greedy", "deterministic"), ("viterbi", "deterministic"),
                           ("greedy", "probabilistic")):
        yield f"lattice-{walk}-{sampling}", LatticeRule(lattice_head(), V, walk, sampling, reference)
        yield (f"lattice+dels-markov-{walk}-{sampling}",
               LatticeDelsRule(lattice_head(), V, markov, prior, w, w, 0, walk, sampling, reference))
    yield "lattice+dels-gru", LatticeDelsRule(lattice_head(), V, gru, prior, w, w, 1, "greedy",
                                              "deterministic", reference)


@pytest.mark.parametrize("edit", [None, _faults], ids=["finite", "fault-rows"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_serving_rules_draft_exactly_the_reference_drafts(dtype, edit):
    config = _config(hm=H, block=6, k=4)
    refs = dict(_rules(dtype, reference=True))
    for name, rule in _rules(dtype, reference=False):
        ref = refs[name]
        assert rule.scorer is not None and ref.scorer is None
        for seed, (bsz, slots) in enumerate(((1, 5), (4, 3), (8, 5), (3, 1))):
            temperature = torch.rand(bsz) if "probabilistic" in name else None
            inputs = _draft_inputs(config, bsz, slots, dtype, seed, edit, temperature)
            torch.manual_seed(seed)
            expected = ref.propose(inputs)
            torch.manual_seed(seed)
            got = rule.propose(inputs)
            assert torch.equal(got.token_ids, expected.token_ids), name
            assert torch.equal(got.faulty_rows, expected.faulty_rows), name
            assert torch.equal(got.fallback_ids, expected.fallback_ids), name
            if expected.probs is None:
                assert got.probs is None
            else:
                same(got.probs, expected.probs)
            if edit is not None and bsz >= 3:
                assert got.faulty_rows[:3].all(), name


def test_a_packed_gemm_that_differs_from_the_reference_is_not_used():
    config = CONFIGS["tiny"]
    head = _head(config, torch.bfloat16)
    serving = ServingLatticeHead(head)
    if not serving.packed:
        pytest.skip("no oneDNN bf16 GEMM on this CPU")
    layout = serving._current()
    wrong = head.feature_mlp.down_proj.weight.detach() * 2
    layout.feature_down.packed = torch.ops.mkldnn._reorder_linear_weight(wrong.contiguous(), None)
    args = _head_inputs(config, 2, 3, torch.bfloat16)
    with torch.inference_mode():
        for _ in range(2):  # the first call checks this row count, the second uses the verdict
            ours, ref = serving.score(*args), head.score(*args)
            same(ours[0], ref[0])
            same(ours[1], ref[1])
    assert layout.feature_down.verified == {2 * 3 * config.candidate_topk: False}
    assert all(layout.pass_hidden_proj.verified.values())


def test_the_floor_bench_prices_the_heads_counted_work_at_the_given_rates():
    """tools.lattice_cpu_bench --floor: the head's FLOPs (counted on the reference path) at the
    GEMM rate plus its weight bytes at the streaming rate. The work grows with the batch, the
    weights do not, and the feature MLP's work on every candidate bounds the count from below."""
    from tools.lattice_cpu_bench import head_floor

    config = CONFIGS["tiny"]
    head = _head(config, torch.float32)
    rates = (2e9, 4e9)
    with torch.inference_mode():
        one, two = (head_floor(head, _head_inputs(config, bsz, 3, torch.float32), rates) for bsz in (1, 2))
    assert two["gflop"] == pytest.approx(2 * one["gflop"], rel=0.05)
    weight_bytes = sum(p.numel() * p.element_size() for p in head.parameters())
    assert one["weights_mib"] == two["weights_mib"] == weight_bytes / 2**20
    assert one["read_ms"] == pytest.approx(weight_bytes / 4e9 * 1e3)
    assert one["compute_ms"] == pytest.approx(one["gflop"] * 1e9 / 2e9 * 1e3)
    # Every candidate node (3 slots x K) passes the feature MLP at least once.
    nodes = 3 * config.candidate_topk
    mlp = head.feature_mlp
    mlp_flops = 2 * nodes * sum(m.weight.numel() for m in mlp.modules() if isinstance(m, torch.nn.Linear))
    assert one["gflop"] * 1e9 >= mlp_flops > 0
