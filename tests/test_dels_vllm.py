"""DeLS and lattice+DeLS draft rules in real vLLM engines."""

import json
import shutil

import pytest

from tests.builders import (
    attach_markov_head,
    attach_random_gru_head,
    build_constant_dflash,
    build_rank_preferring_lilicorr,
)
from tests.engine import (
    changed_fraction,
    counters_list,
    generate,
    plain32,
    predict_counters,
    recording,
)
from vllm_liliprop.fixtures import build_tiny_lilicorr_draft

pytestmark = pytest.mark.vllm
K = 7


@pytest.fixture(scope="module")
def constant_with_markov(tiny_models, ranked):
    """Constant drafter ranking [z0, c, ...] plus a Markov head that always predicts c."""
    draft = build_constant_dflash(tiny_models["root"] / "dels-constant", tiny_models["target"],
                                  ranked)
    attach_markov_head(draft, tiny_models["target"], ranked[1])
    return str(draft)


def constant(token):
    return lambda ys, p: [token] * K


def test_dels_with_zero_weights_is_vanilla_dflash(tiny_models, stock):
    draft = tiny_models["root"] / "dflash-with-dels"
    shutil.copytree(tiny_models["draft"], draft)
    attach_markov_head(draft, tiny_models["target"], 5)
    ids, counters, drafter = generate(tiny_models["target"], draft,
                                      options={"rule": "dels", "dels_alpha": 0, "dels_beta": 0})
    assert drafter.draft_rule.name == "dels"
    assert ids == stock["dflash"]["ids"]
    assert counters_list(counters) == stock["dflash"]["counters"]


def test_strong_short_head_changes_drafts_as_predicted(tiny_models, stock, ranked,
                                                       constant_with_markov):
    plain = stock["plain"]["ids"]
    zero = {"rule": "dels", "dels_alpha": 0.0, "dels_beta": 0.0}
    _, counters, _ = generate(tiny_models["target"], constant_with_markov, options=zero)
    assert counters_list(counters) == predict_counters(plain, constant(ranked[0]), K)

    ids, counters, _ = generate(tiny_models["target"], constant_with_markov,
                                options={"rule": "dels"})
    assert ids == plain32(stock)
    predicted = predict_counters(plain, constant(ranked[1]), K)
    assert predicted[2] > 0
    assert counters_list(counters) == predicted


def test_per_slot_schedule_reaches_only_its_slot(tiny_models, stock, ranked, constant_with_markov):
    alpha = [0.0] * K
    alpha[2] = 0.3
    ids, counters, _ = generate(tiny_models["target"], constant_with_markov,
                                options={"rule": "dels", "dels_alpha": alpha, "dels_beta": 0.0})
    assert ids == plain32(stock)
    drafts = [ranked[0]] * K
    drafts[2] = ranked[1]
    assert counters_list(counters) == predict_counters(stock["plain"]["ids"], lambda ys, p: drafts, K)


@pytest.mark.parametrize("walk", ["greedy", "viterbi"])
def test_lattice_plus_dels_bonus_overrides_the_head(tiny_models, stock, ranked, walk):
    """Head prefers rank 0 (z0) by logit_scale 8; the Markov bonus (0.3 * -50 elsewhere) moves every
    slot to c, in both walks."""
    draft = build_rank_preferring_lilicorr(tiny_models["root"] / f"ld-{walk}", tiny_models["target"],
                                           ranked, rank=0)
    attach_markov_head(draft, tiny_models["target"], ranked[1])
    ids, counters, drafter = generate(tiny_models["target"], draft,
                                      options={"rule": "lattice+dels", "walk": walk})
    assert drafter.draft_rule.name == f"lattice+dels-{walk}"
    assert ids == plain32(stock)
    assert counters_list(counters) == predict_counters(stock["plain"]["ids"], constant(ranked[1]), K)


@pytest.mark.parametrize("walk,head", [("greedy", "markov"), ("viterbi", "markov"), ("greedy", "gru")])
def test_lattice_plus_dels_random_head_moves_drafts(tiny_models, stock, walk, head):
    draft = build_tiny_lilicorr_draft(tiny_models["root"] / f"ld-random-{walk}-{head}",
                                      tiny_models["target"])
    if head == "gru":
        attach_random_gru_head(draft, tiny_models["target"])
    else:
        attach_markov_head(draft, tiny_models["target"], 7, strength=3.0)
    records = []
    ids, counters, drafter = generate(tiny_models["target"], draft, prepare=recording(records),
                                      options={"rule": "lattice+dels", "walk": walk})
    assert drafter.draft_rule.name == f"lattice+dels-{walk}" and drafter.num_rule_faults == 0
    # The head's bonus moved some drafts off the lattice's top candidate (and vLLM's
    # verification kept the output plain, as for any draft).
    assert records and changed_fraction(records) > 0
    assert ids == plain32(stock)


def test_dels_gru_head_moves_drafts_off_the_argmax(tiny_models, stock):
    draft = tiny_models["root"] / "dflash-with-gru"
    shutil.copytree(tiny_models["draft"], draft)
    attach_random_gru_head(draft, tiny_models["target"])
    records = []
    ids, _, drafter = generate(tiny_models["target"], draft, options={"rule": "dels"},
                                prepare=recording(records))
    assert drafter.draft_rule.name == "dels" and drafter.num_rule_faults == 0
    # The fusion moved some drafts off the drafter's argmax (on this random drafter none is
    # accepted either way, so the counters cannot show it).
    assert records and changed_fraction(records) > 0
    assert ids == plain32(stock)


def test_dels_head_for_another_vocabulary_fails_at_load(tiny_models):
    draft = tiny_models["root"] / "dflash-bad-dels"
    shutil.copytree(tiny_models["draft"], draft)
    attach_markov_head(draft, tiny_models["target"], 5)
    config_path = draft / "dels" / "config.json"
    config = json.loads(config_path.read_text())
    config["vocab_size"] = 2048
    config_path.write_text(json.dumps(config))
    with pytest.raises(Exception, match="vocab_size"):
        generate(tiny_models["target"], draft, options={"rule": "dels"})


def _restrict_draft_vocabulary(draft_dir, target_dir, ids):
    """Rewrite a DFlash draft folder with upstream's reduced vocabulary over `ids`."""
    import torch
    from safetensors.torch import load_file, save_file

    from training.export import draft_vocab_tensors

    target = load_file(str(target_dir / "model.safetensors"))
    lm_head = target.get("lm_head.weight", target["model.embed_tokens.weight"])
    weights = load_file(str(draft_dir / "model.safetensors"))
    weights.update(draft_vocab_tensors(torch.tensor(ids), lm_head))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(draft_dir / "model.safetensors"))
    config = json.loads((draft_dir / "config.json").read_text())
    (draft_dir / "config.json").write_text(json.dumps({**config, "draft_vocab_size": len(ids)}))


def test_dels_over_a_reduced_draft_vocabulary_drafts_as_over_the_full_one(tiny_models, stock, ranked,
                                                                          constant_with_markov):
    """The same drafter and short head with a draft vocabulary holding the drafter's and the
    head's favourites: DeLS runs over that vocabulary only and drafts what it drafts over all ids."""
    from pathlib import Path

    draft = tiny_models["root"] / "dels-constant-reduced"
    shutil.copytree(constant_with_markov, draft, dirs_exist_ok=True)
    _restrict_draft_vocabulary(draft, Path(tiny_models["target"]), sorted(set(range(0, 1024, 4)) | set(ranked)))
    ids, counters, drafter = generate(tiny_models["target"], str(draft), options={"rule": "dels"})
    assert drafter.draft_rule.vocab_ids is not None and drafter.draft_rule.head.vocab_size < 1024
    assert ids == plain32(stock)
    assert counters_list(counters) == predict_counters(stock["plain"]["ids"], constant(ranked[1]), K)
    assert drafter.num_rule_faults == 0
