"""Option `sampled_k` (vllm_liliprop/sampled_drafts.py): requests sampled at T > 0 draft at most
the k of their batch size. Pure-torch cut and option checks here; real vLLM engines below: a
mixed batch drafts for its greedy requests exactly what those requests draft alone, greedy
output stays plain decoding's, and an all-sampled batch at k = 0 verifies no draft at all."""

from __future__ import annotations

import pytest
import torch

from vllm_liliprop.draft_length import NO_DRAFT
from vllm_liliprop.options import OptionError, resolve_options
from vllm_liliprop.sampled_drafts import (
    check_sampled_k,
    cut_sampled_rows,
    sampled_k_at,
    sampled_never_draft,
)


def test_sampled_rows_are_cut_and_greedy_rows_kept():
    drafts = torch.arange(12).reshape(3, 4)
    temperature = torch.tensor([0.0, 1.0, 0.7])
    cut = cut_sampled_rows(drafts, temperature, 1)
    assert cut.tolist() == [[0, 1, 2, 3], [4, NO_DRAFT, NO_DRAFT, NO_DRAFT], [8, NO_DRAFT, NO_DRAFT, NO_DRAFT]]
    assert (cut_sampled_rows(drafts, temperature, 0)[1:] == NO_DRAFT).all()
    for unchanged in (cut_sampled_rows(drafts, None, 0), cut_sampled_rows(drafts, temperature, None),
                      cut_sampled_rows(drafts, temperature, 4)):
        assert torch.equal(unchanged, drafts)


def test_the_k_of_a_batch_size_comes_from_its_range():
    ranges = check_sampled_k([[3, 16, 0], [1, 2, 2]], "x")
    assert ranges == ((1, 2, 2), (3, 16, 0))
    assert [sampled_k_at(ranges, b) for b in (1, 2, 3, 16, 17)] == [2, 2, 0, 0, None]
    assert sampled_k_at(None, 4) is None


def test_sampled_requests_never_draft_only_where_every_batch_size_gives_k_0():
    assert sampled_never_draft(check_sampled_k([[1, 8, 0]], "x"), 8)
    assert sampled_never_draft(check_sampled_k([[1, 3, 0], [4, 256, 0]], "x"), 8)
    assert not sampled_never_draft(check_sampled_k([[1, 4, 0]], "x"), 8)  # batch 5-8: full k
    assert not sampled_never_draft(check_sampled_k([[1, 1, 2], [2, 8, 0]], "x"), 8)


@pytest.mark.parametrize("value, message", [
    ([[1, 4, 0], [4, 8, 1]], r"ranges \[1, 4, 0\] and \[4, 8, 1\] overlap"),
    ([[0, 4, 0]], r"entry \[0, 4, 0\] must be \[start, end, k\]"),
    ([[1, 4, -1]], r"entry \[1, 4, -1\] must be"),
    ([[1, 4]], r"entry \[1, 4\] must be"),
    (3, r"sampled_k = 3 must be a list of \[start, end, k\] batch-size ranges"),
])
def test_a_bad_sampled_k_is_refused_naming_the_field(value, message):
    with pytest.raises(OptionError, match=r"dflash_config\.liliprop\.sampled_k"):
        resolve_options(["DFlashDraftModel"], {"liliprop": {"sampled_k": value}}, None)
    with pytest.raises(ValueError, match=message):
        check_sampled_k(value, "liliprop.sampled_k")


def _run(tiny_models, options, requests, num_spec=7):
    """(outputs' token ids, counters, drafter) of one fresh engine given requests [(prompt
    index in tests.engine.PROMPTS, temperature), ...] in one batch."""
    from vllm import LLM, SamplingParams

    from tests.engine import ENGINE_FLAGS, PROMPTS, find_drafter, liliprop_env
    from vllm_liliprop.vllm.metrics import SpecDecodeCounters

    prompts = [PROMPTS[i] for i, _ in requests]
    spec = {"method": "dflash", "model": tiny_models["draft"], "num_speculative_tokens": num_spec}
    with liliprop_env(options):
        llm = LLM(model=tiny_models["target"], speculative_config=spec, max_num_seqs=8, **ENGINE_FLAGS)
        params = [SamplingParams(temperature=t, max_tokens=32, ignore_eos=True, seed=100 + i)
                  for i, t in requests]
        outputs = llm.generate(prompts, params, use_tqdm=False)
    counters = SpecDecodeCounters.read(llm)
    drafter = find_drafter(llm)
    del llm
    return [list(o.outputs[0].token_ids) for o in outputs], counters, drafter


@pytest.mark.vllm
def test_greedy_requests_draft_as_alone_and_sampled_ones_not_at_all(tiny_models, stock):
    from tests.engine import plain32

    plain = plain32(stock)
    cut = {"rule": "argmax", "sampled_k": [[1, 8, 0]]}
    mixed_ids, mixed, _ = _run(tiny_models, cut, [(0, 0.0), (1, 1.0), (2, 0.0), (3, 1.0)])
    assert [mixed_ids[0], mixed_ids[2]] == [plain[0], plain[2]]  # greedy output: plain decoding's
    # Only the greedy requests drafted, each as it does alone: as many drafts and draft tokens
    # as prompts 0 and 2 greedy without the sampled requests beside them.
    alone_ids, alone, _ = _run(tiny_models, cut, [(0, 0.0), (2, 0.0)])
    assert alone_ids == [plain[0], plain[2]]
    assert (mixed.num_drafts, mixed.num_draft_tokens) == (alone.num_drafts, alone.num_draft_tokens)
    assert mixed.num_draft_tokens == 7 * mixed.num_drafts > 0
    uncut_ids, uncut, _ = _run(tiny_models, {"rule": "argmax"}, [(0, 0.0), (1, 1.0), (2, 0.0), (3, 1.0)])
    assert uncut.num_drafts > mixed.num_drafts  # without the option the sampled requests draft too
    assert [uncut_ids[0], uncut_ids[2]] == [plain[0], plain[2]]
    # Every request sampled at k = 0: no draft is verified, the drafter only stores its context.
    sampled_ids, sampled, drafter = _run(tiny_models, cut, [(0, 1.0), (1, 1.0), (2, 1.0)])
    assert sampled.num_drafts == 0 and drafter.num_sampled_plain_steps > 0
    assert all(len(ids) == 32 for ids in sampled_ids)


@pytest.mark.vllm
def test_a_sampled_k_that_cuts_nothing_is_refused_at_engine_start(tiny_models):
    with pytest.raises(Exception, match=r"sampled_k = \[\[1, 4, 7\]\] lets sampled requests draft "
                                        r"every one of the num_speculative_tokens = 7 slots"):
        _run(tiny_models, {"rule": "argmax", "sampled_k": [[1, 4, 7]]}, [(0, 1.0)])


@pytest.mark.vllm
def test_sampled_requests_that_never_draft_skip_the_drafters_context_pass(tiny_models):
    # k = 0 at every batch size: the sampled requests' context is never read, so no pass
    # stores it; a plan that lets them draft at batch 1 keeps storing it. Three requests that
    # finish together never reach batch 1, so both runs verify no draft, and the seeded tokens
    # are the same: skipping the pass changes nothing the target samples.
    requests = [(0, 1.0), (1, 1.0), (2, 1.0)]
    never_ids, never, never_drafter = _run(tiny_models, {"rule": "argmax", "sampled_k": [[1, 8, 0]]},
                                           requests)
    later_ids, later, later_drafter = _run(
        tiny_models, {"rule": "argmax", "sampled_k": [[1, 1, 2], [2, 8, 0]]}, requests)
    assert never.num_drafts == later.num_drafts == 0
    assert never_drafter.num_sampled_context_skips == never_drafter.num_sampled_plain_steps > 0
    assert never_drafter.num_context_only_steps == 0
    assert later_drafter.num_sampled_context_skips == 0
    assert later_drafter.num_context_only_steps == later_drafter.num_sampled_plain_steps > 0
    assert never_ids == later_ids
