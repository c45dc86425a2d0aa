"""A real rule whose head turns NaN in a running vLLM engine: its rows fall back, nothing breaks.

One engine per rule family. The NaN goes into the live rule's own tensors once the engine has
loaded (a checkpoint with NaN weights may be refused at load instead, which would test the
loader, not the fault path). Every row is then faulty, so each step drafts the drafter's
argmax: the engine must keep running, greedy output must equal plain decoding, and the
proposer must count the faults. The per-rule detail is in tests/test_rule_faults.py.
"""

import math
import shutil

import pytest
import torch

from tests.builders import attach_markov_head, attach_random_gru_head
from tests.engine import counters_list, generate, plain32
from vllm_liliprop.fixtures import build_tiny_lilicorr_draft

pytestmark = pytest.mark.vllm


def poison(get_tensor, value: float = math.nan):
    """A `generate(prepare=...)` hook that fills the tensor get_tensor(drafter) with `value`
    (NaN: a head that faults; a huge finite value: one that saturates without faulting)."""
    def prepare(drafter):
        with torch.inference_mode():
            get_tensor(drafter).fill_(value)
    return prepare


def run_poisoned(tiny_models, draft, options, get_tensor):
    ids, counters, drafter = generate(tiny_models["target"], draft, options=options,
                                      prepare=poison(get_tensor))
    assert drafter.num_rule_faults > 0
    assert counters.num_drafts > 0
    return ids, counters, drafter


def test_lattice_head_weight_nan(tiny_models, stock):
    draft = build_tiny_lilicorr_draft(tiny_models["root"] / "faults-lilicorr", tiny_models["target"])
    ids, _, drafter = run_poisoned(tiny_models, draft, {"walk": "viterbi"},
                                   lambda drafter: drafter.draft_rule.head.in_head.weight)
    assert drafter.draft_rule.name == "lattice-viterbi"
    assert ids == plain32(stock)


def test_dels_gru_head_weight_nan(tiny_models, stock):
    """On the stock fixture's drafter every row falling back is exactly stock DFlash."""
    draft = tiny_models["root"] / "faults-dels-gru"
    shutil.copytree(tiny_models["draft"], draft)
    attach_random_gru_head(draft, tiny_models["target"])
    ids, counters, drafter = run_poisoned(tiny_models, draft, {"rule": "dels"},
                                          lambda drafter: drafter.draft_rule.head.gru.weight_hh_l0)
    assert drafter.draft_rule.name == "dels"
    assert ids == plain32(stock)
    assert counters_list(counters) == stock["dflash"]["counters"]


def test_lattice_plus_dels_prior_nan(tiny_models, stock):
    draft = build_tiny_lilicorr_draft(tiny_models["root"] / "faults-lattice-dels",
                                      tiny_models["target"])
    attach_markov_head(draft, tiny_models["target"], 7, strength=3.0)
    ids, _, drafter = run_poisoned(tiny_models, draft, {"rule": "lattice+dels"},
                                   lambda drafter: drafter.draft_rule.log_prior)
    assert drafter.draft_rule.name == "lattice+dels-greedy"
    assert ids == plain32(stock)


def test_argmax_drafter_nan(tiny_models, stock):
    """No head: a drafter that yields NaN is counted too (its fallback is itself)."""
    ids, _, drafter = run_poisoned(tiny_models, tiny_models["draft"], {"rule": "argmax"},
                                   lambda drafter: drafter.model.model.norm.weight)
    assert drafter.draft_rule.name == "argmax"
    assert ids == plain32(stock)
