"""Faulty-row replacement and the device-side fault counter (rules/fallback.py)."""

import pytest
import torch

from vllm_liliprop.rules import DraftInputs, DraftOutput, argmax_drafts
from vllm_liliprop.rules.fallback import FaultCounter, apply_fallback

B, S, H, V = 4, 3, 8, 11


def _inputs() -> DraftInputs:
    generator = torch.Generator().manual_seed(0)
    lm_head = torch.randn(V, H, generator=generator)
    return DraftInputs(
        hidden=torch.randn(B, S, H, generator=generator),
        anchor_ids=torch.zeros(B, dtype=torch.long),
        compute_logits=lambda hidden: hidden @ lm_head.T,
        embed=torch.nn.Embedding(V, H),
    )


FAULTY = torch.tensor([True, False, False, True])


def test_rows_without_faults_pass_through_untouched():
    inputs = _inputs()
    drafts = torch.full((B, S), 5)
    probs = torch.rand(B, S, V)
    token_ids, out_probs = apply_fallback(inputs, DraftOutput(drafts, probs))
    assert token_ids is drafts and out_probs is probs


def test_faulty_rows_get_the_argmax_recomputed_from_the_drafter():
    inputs = _inputs()
    drafts = torch.full((B, S), 5)
    probs = torch.softmax(torch.randn(B, S, V), -1)
    probs[0, 1] = float("nan")  # what a faulty row may hold
    token_ids, out_probs = apply_fallback(inputs, DraftOutput(drafts, probs, FAULTY))
    argmax = argmax_drafts(inputs)
    assert torch.equal(token_ids[FAULTY], argmax[FAULTY])
    assert torch.equal(token_ids[~FAULTY], drafts[~FAULTY])
    assert torch.equal(out_probs[~FAULTY], probs[~FAULTY])
    one_hot = torch.nn.functional.one_hot(argmax[FAULTY], V).float()
    assert torch.equal(out_probs[FAULTY], one_hot)


def test_fallback_ids_from_the_rule_are_used_as_given():
    inputs = _inputs()
    given = torch.full((B, S), 7)
    token_ids, _ = apply_fallback(inputs, DraftOutput(torch.zeros(B, S, dtype=torch.long),
                                                      faulty_rows=FAULTY, fallback_ids=given))
    assert token_ids[:, 0].tolist() == [7, 0, 0, 7]


def test_wrong_draft_shape_is_an_error_naming_both_shapes():
    with pytest.raises(ValueError, match=r"shape \(4, 2\), expected \(4, 3\)"):
        apply_fallback(_inputs(), DraftOutput(torch.zeros(B, 2, dtype=torch.long)))


def test_fault_counter_counts_on_the_device_and_reports_the_first_fault_once():
    reports = []
    counter = FaultCounter(reports.append)
    counter.add(torch.zeros(B, dtype=torch.bool))
    assert reports == [] and counter.total == 0
    counter.add(FAULTY)
    counter.add(FAULTY)
    assert reports == [2]  # the first step with a fault, with its count; then silence
    assert counter.total == 4


def test_fault_counter_without_steps_is_zero():
    assert FaultCounter(lambda count: None).total == 0
