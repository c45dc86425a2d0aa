"""Recovered tokens at T > 0 on CPU (vllm/recovered_tokens.py, patch 13): the residual
distribution, as vLLM's own draw gives it, with seeded rows reproducible and drawn once."""

from __future__ import annotations

from collections import Counter

import pytest
import torch


pytestmark = pytest.mark.vllm
VOCAB = 6


class _Metadata:
    def __init__(self, generators):
        self.generators = generators


def _recovered(sample, target_probs, draft, trials: int, seeded: bool) -> Counter:
    """How often each token is recovered for a one-token draft `draft`, over `trials` requests."""
    from vllm.platforms import current_platform

    current_platform.register_triton_kernel_overrides()  # what an engine's start does on CPU
    generators = {i: torch.Generator().manual_seed(1000 + i) for i in range(trials)} if seeded else {}
    drafts = torch.full((trials,), draft, dtype=torch.int32)
    cu = torch.arange(1, trials + 1, dtype=torch.int32)
    probs = target_probs.expand(trials, VOCAB).contiguous()
    ids = sample(1, [1] * trials, cu, drafts, None, probs, _Metadata(generators), torch.device("cpu"))
    return Counter(ids.tolist())


@pytest.mark.parametrize("seeded", [False, True])
def test_recovered_tokens_follow_the_residual_distribution_as_vllms_do(seeded):
    from scipy.stats import chisquare
    from vllm.v1.sample import rejection_sampler

    from vllm_liliprop.vllm import patching
    from vllm_liliprop.vllm.recovered_tokens import sample_recovered_tokens

    patching.apply_patches()
    vllms = getattr(rejection_sampler.sample_recovered_tokens, "__liliprop_original__")
    torch.manual_seed(0)
    target = torch.tensor([0.05, 0.4, 0.3, 0.15, 0.1, 0.0])
    residual = target.clone()
    residual[1] = 0  # a deterministic draft of token 1: recovered from p without it
    ours = _recovered(sample_recovered_tokens, target, 1, 4000, seeded)
    theirs = _recovered(vllms, target, 1, 4000, seeded)
    assert ours[1] == 0 and ours[5] == 0 and theirs[1] == 0
    kept = (0, 2, 3, 4)
    mass = [float(residual[v]) for v in kept]
    expected = [4000 * m / sum(mass) for m in mass]
    assert chisquare([ours[v] for v in kept], expected).pvalue > 1e-3, ours
    assert chisquare([theirs[v] for v in kept], expected).pvalue > 1e-3, theirs
    swapped = [expected[i] for i in (0, 2, 1, 3)]  # the test sees two tokens' mass swapped
    assert chisquare([ours[v] for v in kept], swapped).pvalue < 1e-6


def test_seeded_rows_repeat_and_come_only_from_their_generator():
    from vllm_liliprop.vllm.recovered_tokens import exponential_rows

    def generators():
        return {0: torch.Generator().manual_seed(5), 2: torch.Generator().manual_seed(6)}

    first, again = generators(), generators()
    a = exponential_rows(3, 1000, first, [True, True, True])
    torch.manual_seed(123)  # the unseeded row moves; the seeded ones do not
    b = exponential_rows(3, 1000, again, [True, True, True])
    assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2]) and not torch.equal(a[1], b[1])
    idle = generators()
    exponential_rows(3, 1000, idle, [True, True, False])  # row 2 has no draft: its generator waits
    assert torch.equal(idle[2].get_state(), generators()[2].get_state())
    assert not torch.equal(idle[0].get_state(), generators()[0].get_state())
    noise = exponential_rows(8, 50_000, {}, [True] * 8)
    assert abs(noise.mean().item() - 1) < 0.01 and abs(noise.var().item() - 1) < 0.03
    assert (noise > 0).all() and abs((noise < 0.1).double().mean().item() - (1 - torch.e ** -0.1)) < 0.003
