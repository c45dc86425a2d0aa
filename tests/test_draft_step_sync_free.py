"""The draft step never reads a device value on the host (CUDA-graph friendly, no stalls).

Probe: run every rule, plus the proposer's faulty-row replacement, on tensors of the `meta`
device. Meta tensors have shapes but no data, so anything that needs a value on the host
(`.item()`, `bool(t)`, `.tolist()`, `nonzero`, boolean-mask indexing, data-dependent shapes)
raises, while static-shape device work runs. The torch paths checked here are also what the
runtime runs on CUDA wherever a kernel does not apply; the Triton kernels have their own
sync checks in `python -m tools.kernels.device_check`.
"""

import pytest
import torch

from vllm_liliprop.draft_length import confident_cut
from vllm_liliprop.heads.dels import GRUShortHead, MarkovShortHead
from vllm_liliprop.heads.lattice import LatticeConfig, LatticeHead
from vllm_liliprop.rules import ArgmaxRule, DraftInputs, DraftOutput
from vllm_liliprop.rules.dels import DelsRule
from vllm_liliprop.rules.fallback import apply_fallback
from vllm_liliprop.rules.lattice import LatticeRule
from vllm_liliprop.rules.lattice_dels import LatticeDelsRule

V, H, B, S, K = 97, 32, 3, 7, 4
META = torch.device("meta")


def _lattice_head() -> LatticeHead:
    config = LatticeConfig(
        model_hidden_size=H, block_size=S + 1, rms_norm_eps=1e-6, candidate_topk=K,
        hidden_size=0, num_layers=1, num_heads=2, mlp_ratio=2.0, factor_dim=8,
        vector_eps=1e-6, logit_scale=10.0,
    )
    return LatticeHead(config).to(META).eval()


def _short_head(kind: str):
    if kind == "markov":
        return MarkovShortHead(V, 8, device=META).eval()
    return GRUShortHead(torch.nn.Embedding(V, 16, device=META), 24, 8, device=META).eval()


def _inputs(sampled: bool) -> DraftInputs:
    lm_head = torch.empty(V, H, device=META)
    return DraftInputs(
        hidden=torch.empty(B, S, H, device=META),
        anchor_ids=torch.empty(B, dtype=torch.long, device=META),
        compute_logits=lambda hidden: hidden @ lm_head.T,
        embed=torch.nn.Embedding(V, H, device=META),
        anchor_hidden=torch.empty(B, H, device=META),
        anchor_valid=torch.empty(B, dtype=torch.bool, device=META),
        temperature=torch.empty(B, device=META) if sampled else None,
    )


def _rules():
    prior = torch.empty(V, device=META)
    weights = [0.3] * S
    yield "argmax", ArgmaxRule(), False
    yield "argmax-confidence", ArgmaxRule(reports_confidence=True), False  # draft_confidence_floor
    yield "lattice-greedy", LatticeRule(_lattice_head(), V, "greedy"), False
    yield "lattice-greedy-confidence", LatticeRule(_lattice_head(), V, "greedy", reports_confidence=True), False
    yield "lattice-viterbi", LatticeRule(_lattice_head(), V, "viterbi"), False
    yield "lattice-sampled", LatticeRule(_lattice_head(), V, "greedy", "probabilistic"), True
    for kind in ("markov", "gru"):
        for prefix in (0, 1):
            yield f"dels-{kind}-p{prefix}", DelsRule(_short_head(kind), prior, weights, weights, prefix), False
        yield f"dels-{kind}-sampled", DelsRule(_short_head(kind), prior, weights, weights, 0,
                                               "probabilistic"), True
        yield f"lattice+dels-{kind}-greedy", LatticeDelsRule(
            _lattice_head(), V, _short_head(kind), prior, weights, weights, 0), False
    yield "lattice+dels-markov-viterbi", LatticeDelsRule(
        _lattice_head(), V, _short_head("markov"), prior, weights, weights, 0, "viterbi"), False
    yield "lattice+dels-markov-sampled", LatticeDelsRule(
        _lattice_head(), V, _short_head("markov"), prior, weights, weights, 0, "greedy",
        "probabilistic"), True


RULES = list(_rules())


@pytest.mark.parametrize("rule, sampled", [r[1:] for r in RULES], ids=[r[0] for r in RULES])
def test_rule_and_fallback_run_without_host_reads(rule, sampled):
    inputs = _inputs(sampled)
    output = rule.propose(inputs)
    token_ids, probs = apply_fallback(inputs, output)
    if output.confidence is not None:  # the proposer's confidence cut, as served
        token_ids = confident_cut(token_ids, output.confidence, 0.06, inputs.temperature)
    assert token_ids.device == META and token_ids.shape == (B, S)
    assert (probs is not None) == sampled
    if sampled:
        assert probs.shape == (B, S, V)


def test_the_probe_catches_a_host_read():
    """The probe would fail a rule that looks at its scores on the host."""

    class PeekingRule:
        def propose(self, inputs):
            logits = inputs.long_logits()
            if bool(torch.isfinite(logits).all()):
                return DraftOutput(logits.argmax(-1))
            return DraftOutput(logits.argmax(-1), faulty_rows=torch.ones(B, dtype=torch.bool))

    with pytest.raises((RuntimeError, NotImplementedError)):
        PeekingRule().propose(_inputs(False))


def test_a_rule_without_fallback_ids_gets_the_argmax_recomputed_without_host_reads():
    inputs = _inputs(False)
    output = DraftOutput(torch.empty(B, S, dtype=torch.long, device=META),
                         faulty_rows=torch.empty(B, dtype=torch.bool, device=META))
    token_ids, probs = apply_fallback(inputs, output)
    assert token_ids.shape == (B, S) and probs is None
