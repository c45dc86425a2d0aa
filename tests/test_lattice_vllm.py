"""The LiLiCorr lattice rule in real vLLM engines (V1 runner, CPU)."""

import pytest
import torch

from tests.builders import build_constant_dflash, build_rank_preferring_lilicorr
from tests.engine import (
    counters_list,
    generate,
    plain32,
    predict_counters,
)
from vllm_liliprop.fixtures import build_tiny_lilicorr_draft
from vllm_liliprop.heads.candidate_vocab import write_candidate_vocab

pytestmark = pytest.mark.vllm
K = 7  # num_speculative_tokens


@pytest.fixture(scope="module")
def random_lilicorr(tiny_models):
    return str(build_tiny_lilicorr_draft(tiny_models["root"] / "lilicorr", tiny_models["target"]))


@pytest.mark.parametrize("walk", ["greedy", "viterbi"])
def test_lattice_greedy_output_equals_plain_decoding(tiny_models, stock, random_lilicorr, walk):
    ids, counters, drafter = generate(tiny_models["target"], random_lilicorr,
                                      options={"walk": walk})
    assert drafter.draft_rule.name == f"lattice-{walk}"
    assert drafter.num_rule_faults == 0
    assert counters.num_drafts > 0
    assert ids == plain32(stock)


@pytest.mark.parametrize("walk", ["greedy", "viterbi"])
def test_head_that_prefers_a_known_path_decides_the_drafts(tiny_models, stock, ranked, walk):
    """The drafter always ranks [z0, c, z1, z2]; a head built to prefer rank 1 must draft c in every
    slot (counters = those predicted for constant c), and argmax drafting must draft z0."""
    root = tiny_models["root"]
    prefers_rank1 = build_rank_preferring_lilicorr(root / f"rank1-{walk}", tiny_models["target"],
                                                   ranked, rank=1)
    plain = stock["plain"]["ids"]
    ids, counters, drafter = generate(tiny_models["target"], prefers_rank1, options={"walk": walk})
    assert ids == plain32(stock)
    predicted = predict_counters(plain, lambda ys, p: [ranked[1]] * K, K)
    assert predicted[2] > 0
    assert counters_list(counters) == predicted

    ids, counters, _ = generate(tiny_models["target"], prefers_rank1, options={"rule": "argmax"})
    assert ids == plain32(stock)
    assert counters_list(counters) == predict_counters(plain, lambda ys, p: [ranked[0]] * K, K)


def test_stock_dflash_on_the_constant_drafter_matches_prediction(tiny_models, stock, ranked):
    """Control for the prediction itself: stock drafting of the same drafter drafts z0."""
    draft = build_constant_dflash(tiny_models["root"] / "constant", tiny_models["target"], ranked)
    plain = stock["plain"]["ids"]
    ids, counters, drafter = generate(tiny_models["target"], draft)
    assert drafter.draft_rule is None
    assert counters_list(counters) == predict_counters(plain, lambda ys, p: [ranked[0]] * K, K)


def test_shorter_draft_than_block_uses_slot_prefix(tiny_models, stock, random_lilicorr):
    ids, counters, drafter = generate(tiny_models["target"], random_lilicorr, num_spec=3)
    assert ids == plain32(stock)
    assert counters.num_draft_tokens == 3 * counters.num_drafts


def test_under_load_with_preemption_outputs_stay_exact(tiny_models, random_lilicorr):
    """256 requests, 32 resident, a KV cache far too small for all of them: preemption happens."""
    prompts = [f"x{i} = {i} * (" for i in range(256)]
    flags = {"max_num_seqs": 32, "num_gpu_blocks_override": 24, "max_model_len": 256,
             "block_size": 32}
    plain, _, _ = generate(tiny_models["target"], None, prompts=prompts, max_tokens=24,
                           extra_flags=flags)
    metrics = {}
    spec, counters, drafter = generate(tiny_models["target"], random_lilicorr, prompts=prompts,
                                       max_tokens=24, extra_flags=flags, metrics_out=metrics)
    assert metrics["vllm:num_preemptions"] > 0
    assert len(spec) == 256 and all(len(ys) == 24 for ys in spec)
    assert spec == plain
    assert drafter.num_rule_faults == 0


def test_candidate_vocab_decides_the_candidates(tiny_models, stock, ranked):
    """A draft whose candidate_vocab/ leaves out the drafter's favourite z0: the lattice's
    candidates are [c, z1, z2, ...], so a head that walks rank 0 drafts c in every slot
    (counters = those predicted for constant c) where without the folder it drafts z0."""
    root = tiny_models["root"]
    draft = build_rank_preferring_lilicorr(root / "rank0-vocab", tiny_models["target"], ranked, rank=0)
    plain = stock["plain"]["ids"]
    _, counters, _ = generate(tiny_models["target"], draft)
    assert counters_list(counters) == predict_counters(plain, lambda ys, p: [ranked[0]] * K, K)

    vocab = torch.tensor([i for i in range(1024) if i != ranked[0]])
    write_candidate_vocab(draft, vocab)
    ids, counters, drafter = generate(tiny_models["target"], draft)
    assert torch.equal(drafter.draft_rule.vocab_ids.cpu(), vocab)
    assert ids == plain32(stock)
    predicted = predict_counters(plain, lambda ys, p: [ranked[1]] * K, K)
    assert predicted[2] > 0
    assert counters_list(counters) == predicted
