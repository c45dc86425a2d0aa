"""The proposer's greedy draft (vllm_liliprop/vllm/draft_greedy.py) equals vLLM's
scatter-then-argmax, ties included, for full and reduced draft vocabularies."""

import pytest
import torch

from vllm_liliprop.vllm.draft_greedy import DraftVocabArgmax


class TinyDraft:
    """The attributes DFlashQwen3ForCausalLM gives the fast path, and vLLM's compute_logits."""

    def __init__(self, weight: torch.Tensor, vocab_size: int, offsets: torch.Tensor | None):
        self.lm_head, self.vocab_size = weight, vocab_size
        self.draft_id_to_target_id = offsets
        self.logits_processor = lambda head, hidden: hidden @ head.T

    def compute_logits(self, hidden):  # qwen3_dflash.DFlashQwen3ForCausalLM.compute_logits
        logits = self.logits_processor(self.lm_head, hidden)
        if self.draft_id_to_target_id is None:
            return logits
        targets = torch.arange(logits.shape[1]) + self.draft_id_to_target_id
        full = logits.new_full((logits.shape[0], self.vocab_size), float("-inf"))
        full[:, targets] = logits
        return full


@pytest.mark.parametrize("reduced", [False, True], ids=["full", "reduced"])
def test_fast_greedy_equals_vllm_argmax_with_ties(reduced):
    torch.manual_seed(0)
    vocab, hidden = 300, 16
    ids = torch.sort(torch.randperm(vocab)[:100]).values if reduced else torch.arange(vocab)
    # Coarse bf16 weights and hidden states: many rows hold exact ties for the maximum.
    weight = torch.randint(-2, 3, (ids.numel(), hidden)).to(torch.bfloat16)
    states = torch.randint(-1, 2, (64, hidden)).to(torch.bfloat16)
    model = TinyDraft(weight, vocab, (ids - torch.arange(ids.numel())) if reduced else None)
    fast = DraftVocabArgmax.for_model(model, vllm_paths=False)
    logits = model.compute_logits(states)
    assert (logits == logits.max(-1, keepdim=True).values).sum(-1).gt(1).any()  # ties exist
    assert torch.equal(fast(states), logits.argmax(-1))


def test_vllm_paths_and_unordered_mappings_keep_vllms_own_argmax():
    weight = torch.zeros(3, 4)
    assert DraftVocabArgmax.for_model(TinyDraft(weight, 8, None), vllm_paths=True) is None
    shuffled = torch.tensor([5, 1, 7]) - torch.arange(3)
    assert DraftVocabArgmax.for_model(TinyDraft(weight, 8, shuffled), vllm_paths=False) is None
    assert DraftVocabArgmax.for_model(object(), vllm_paths=False) is None


@pytest.mark.parametrize("reduced", [False, True], ids=["full", "reduced"])
def test_the_argmax_rule_drafts_vllms_argmax_over_the_draft_vocabulary(reduced):
    """The `argmax` rule (a cut block, the hybrid's inner rule) takes the same tokens as vLLM's
    scatter-then-argmax, ties included, reading only the draft vocabulary's logits."""
    from vllm_liliprop.rules import DraftInputs
    from vllm_liliprop.rules.base import ArgmaxRule
    from vllm_liliprop.vllm.draft_greedy import draft_vocab_logits

    torch.manual_seed(1)
    vocab, hidden = 300, 16
    ids = torch.sort(torch.randperm(vocab)[:100]).values if reduced else torch.arange(vocab)
    weight = torch.randint(-2, 3, (ids.numel(), hidden)).to(torch.bfloat16)
    model = TinyDraft(weight, vocab, (ids - torch.arange(ids.numel())) if reduced else None)
    states = torch.randint(-1, 2, (8, 3, hidden)).to(torch.bfloat16)
    inputs = DraftInputs(hidden=states, anchor_ids=torch.zeros(8, dtype=torch.long),
                         compute_logits=model.compute_logits, embed=None,
                         draft_vocab_logits=draft_vocab_logits(model) if reduced else None)
    out = ArgmaxRule(ids if reduced else None).propose(inputs)
    expected = model.compute_logits(states.reshape(24, hidden)).argmax(-1).view(8, 3)
    assert torch.equal(out.token_ids, expected) and torch.equal(out.fallback_ids, expected)
    assert not out.faulty_rows.any()
