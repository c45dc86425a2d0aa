"""A LiLiCorr draft's candidate vocabulary (heads/candidate_vocab.py): the rule scoring only those
LM head rows builds the lattice a full-vocabulary rule builds when every other id scores -inf,
and a bad candidate_vocab/ file is refused at load with the file and the fix named. Served in a
real engine: tests/test_lattice_vllm.py::test_candidate_vocab_decides_the_candidates."""

import math

import pytest
import torch
from safetensors.torch import save_file

from training.head_store import within_vocab
from vllm_liliprop.heads.candidate_vocab import read_candidate_vocab, write_candidate_vocab
from vllm_liliprop.heads.lattice import LatticeConfig, LatticeHead
from vllm_liliprop.rules import DraftInputs
from vllm_liliprop.rules.lattice import LatticeRule

V, H, B, S, K = 40, 16, 3, 5, 4
KEPT = torch.tensor([1, 2, 3, 5, 8, 13, 21, 34, 35, 36])  # ascending target ids


def _head() -> LatticeHead:
    torch.manual_seed(1)
    config = LatticeConfig(model_hidden_size=H, block_size=S + 1, rms_norm_eps=1e-6, candidate_topk=K,
                           hidden_size=0, num_layers=1, num_heads=2, mlp_ratio=2.0, factor_dim=8,
                           vector_eps=1e-6, logit_scale=10.0)
    head = LatticeHead(config)
    for param in head.parameters():
        torch.nn.init.normal_(param, std=0.5)
    return head.eval()


def _inputs(restricted: bool) -> DraftInputs:
    generator = torch.Generator().manual_seed(7)
    lm_head, table = torch.randn(V, H, generator=generator), torch.randn(V, H, generator=generator)
    hidden = torch.randn(B, S, H, generator=generator) * 2

    def full(h):  # what the candidates would be over V if every id outside KEPT scored -inf
        logits = h @ lm_head.T
        return torch.full_like(logits, -math.inf).index_copy_(-1, KEPT, logits[:, KEPT]) if restricted else logits

    return DraftInputs(hidden=hidden, anchor_ids=torch.zeros(B, dtype=torch.long), compute_logits=full,
                       embed=lambda ids: table[ids], anchor_hidden=torch.randn(B, H, generator=generator),
                       anchor_valid=torch.ones(B, dtype=torch.bool),
                       draft_vocab_logits=lambda h: h @ lm_head[KEPT].T)


@pytest.mark.parametrize("walk", ["greedy", "viterbi"])
def test_the_rows_of_the_candidate_vocabulary_give_the_masked_full_lattice(walk):
    head = _head()
    over_rows = LatticeRule(head, V, walk, vocab_ids=KEPT)
    masked = LatticeRule(head, V, walk)
    a, b = over_rows.lattice(_inputs(False)), masked.lattice(_inputs(True))
    assert torch.equal(a.candidate_ids, b.candidate_ids)
    assert set(a.candidate_ids.unique().tolist()) <= set(KEPT.tolist())
    for x, y in ((a.log_probs, b.log_probs), (a.start, b.start), (a.pairs, b.pairs)):
        torch.testing.assert_close(x, y)
    assert torch.equal(over_rows.propose(_inputs(False)).token_ids, masked.propose(_inputs(True)).token_ids)
    # Without the restriction the lattice holds ids outside KEPT (the test can tell them apart).
    assert not set(masked.lattice(_inputs(False)).candidate_ids.unique().tolist()) <= set(KEPT.tolist())


def test_the_head_store_restricts_its_candidates_the_same_way():
    logits = torch.randn(4, V)
    kept = within_vocab(logits, KEPT)
    assert torch.equal(kept[:, KEPT], logits[:, KEPT]) and kept.isinf().sum() == 4 * (V - KEPT.numel())
    assert within_vocab(logits, None) is logits


def test_written_vocabulary_reads_back_and_a_draft_without_one_has_none(tmp_path):
    assert read_candidate_vocab(tmp_path, V, K) is None
    assert read_candidate_vocab(None, V, K) is None
    write_candidate_vocab(tmp_path, KEPT.flip(0))  # sorted on write
    assert torch.equal(read_candidate_vocab(tmp_path, V, K), KEPT)


@pytest.mark.parametrize("ids, message", [
    (torch.tensor([3, 2, 5, 7]), "strictly increasing"),
    (torch.tensor([1, 2, 3, V]), r"\[0, 40\)"),
    (torch.tensor([1, 2]), "fewer than lilicorr_candidate_topk = 4"),
    (torch.tensor([[1, 2, 3, 4]]), "1-D integer tensor 'target_ids'"),
    (torch.tensor([1.0, 2.0, 3.0, 4.0]), "1-D integer tensor 'target_ids'"),
])
def test_a_bad_vocabulary_is_refused_naming_the_file_and_the_fix(tmp_path, ids, message):
    (tmp_path / "candidate_vocab").mkdir()
    save_file({"target_ids": ids}, str(tmp_path / "candidate_vocab" / "model.safetensors"))
    with pytest.raises(ValueError, match=message) as error:
        read_candidate_vocab(tmp_path, V, K)
    assert "candidate_vocab/model.safetensors" in str(error.value)
    assert "delete" in str(error.value)


def test_an_unreadable_vocabulary_file_is_refused(tmp_path):
    (tmp_path / "candidate_vocab").mkdir()
    (tmp_path / "candidate_vocab" / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="cannot be read"):
        read_candidate_vocab(tmp_path, V, K)
