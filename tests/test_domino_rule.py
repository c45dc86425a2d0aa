"""The Domino rule without an engine: its folder and errors, its drafts against
`sequential_draft` on the same inputs (full and reduced vocabularies, a head over another
vocabulary), sampled drafts, and faults. The engine-level counterpart is tests/test_domino_vllm.py."""

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from vllm_liliprop.heads.domino import DominoConfig, DominoHead, save_domino_head
from vllm_liliprop.heads.sequential import sequential_draft
from vllm_liliprop.options import LiliPropOptions, OptionError
from vllm_liliprop.rules import DraftInputs
from vllm_liliprop.rules.domino import DominoRule
from vllm_liliprop.rules.factory import RuleResources, build_rule
from vllm_liliprop.rules.fallback import apply_fallback

V, E, H, R, B, S = 48, 12, 16, 4, 3, 5
CPU = torch.device("cpu")
TABLE = torch.randn(V, E, generator=torch.Generator().manual_seed(0))
LM_HEAD = torch.randn(V, H, generator=torch.Generator().manual_seed(1))
REDUCED = torch.arange(0, V, 2)


def random_head(vocab_ids=None, seed=0) -> DominoHead:
    torch.manual_seed(seed)
    vocab_ids = torch.arange(V) if vocab_ids is None else vocab_ids
    head = DominoHead(DominoConfig(V, E, H, R), TABLE, vocab_ids)
    for param in head.parameters():
        torch.nn.init.normal_(param)
    return head


def draft_dir(tmp_path: Path, head: DominoHead, folder="domino") -> Path:
    save_domino_head(tmp_path / folder, head, torch.float32)
    return tmp_path


def resources(directory, draft_vocab_ids=None) -> RuleResources:
    return RuleResources(draft_dir=directory, vocab_size=V, device=CPU, dtype=torch.float32,
                         embed_weight=TABLE, num_slots=S, draft_hidden_size=H,
                         draft_vocab_ids=draft_vocab_ids)


def inputs(seed=2, temperature=None, reduced=False) -> DraftInputs:
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, S, H, generator=generator)
    return DraftInputs(
        hidden=hidden, anchor_ids=torch.randint(0, V, (B,), generator=generator),
        compute_logits=lambda h: h @ LM_HEAD.T, embed=lambda ids: TABLE[ids],
        temperature=temperature,
        draft_vocab_logits=(lambda h: h @ LM_HEAD[REDUCED].T) if reduced else None,
    )


def build(directory, draft_vocab_ids=None, **options) -> DominoRule:
    return build_rule(LiliPropOptions(rule="domino", **options), resources(directory, draft_vocab_ids))


class Columns(torch.nn.Module):
    """A full-vocabulary head seen through the columns `ids`: the reference for `restricted_to`."""

    def __init__(self, head, ids):
        super().__init__()
        self.head, self.ids = head, ids

    def init_state(self, batch, device=None):
        return self.head.init_state(batch, device)

    def step(self, state, prev, hidden):
        residual, state = self.head.step(state, prev, hidden)
        return residual[:, self.ids], state


def test_full_vocabulary_drafts_are_sequential_draft_and_differ_from_the_argmax(tmp_path):
    head = random_head()
    rule = build(draft_dir(tmp_path, head))
    assert isinstance(rule, DominoRule) and rule.name == "domino" and rule.vocab_ids is None
    x = inputs()
    out = rule.propose(x)
    expected, _ = sequential_draft(x.long_logits(), x.anchor_ids, x.hidden, head.eval())
    assert torch.equal(out.token_ids, expected)
    assert torch.equal(out.fallback_ids, x.long_logits().argmax(-1))
    assert not out.faulty_rows.any() and out.probs is None
    assert not torch.equal(out.token_ids, out.fallback_ids)


@pytest.mark.parametrize("head_ids", ["same", "all"])
def test_reduced_vocabulary_drafts_map_to_target_ids(tmp_path, head_ids):
    """A head over the draft's own ids, and one over every id (restricted_to the draft's)."""
    head = random_head(REDUCED if head_ids == "same" else None)
    rule = build(draft_dir(tmp_path, head), draft_vocab_ids=REDUCED)
    assert torch.equal(rule.head.vocab_ids, REDUCED) and rule.head.up.weight.shape[0] == REDUCED.numel()
    x = inputs(reduced=True)
    out = rule.propose(x)
    reference = head if head_ids == "same" else Columns(head, REDUCED)
    expected, _ = sequential_draft(x.draft_logits(), x.anchor_ids, x.hidden, reference,
                                   vocab_ids=REDUCED)
    assert torch.equal(out.token_ids, REDUCED[expected])
    assert torch.equal(out.fallback_ids, REDUCED[x.draft_logits().argmax(-1)])
    assert not out.faulty_rows.any()


def test_full_vocabulary_draft_with_a_head_over_part_of_it(tmp_path):
    """Ids the head never scored get no residual: the base logits alone."""
    head = random_head(REDUCED)
    rule = build(draft_dir(tmp_path, head))
    assert rule.head.up.weight.shape[0] == V
    assert torch.equal(rule.head.up.weight[1::2], torch.zeros(V // 2, R))
    assert torch.equal(rule.head.up.weight[::2], head.up.weight)


def test_sampled_drafts_return_their_distributions(tmp_path):
    rule = build(draft_dir(tmp_path, random_head()), draft_vocab_ids=REDUCED,
                 sampling="probabilistic")
    assert rule.name == "domino-sampled"
    temperature = torch.tensor([1.0, 0.0, 0.7])
    out = rule.propose(inputs(temperature=temperature, reduced=True))
    assert out.probs.shape == (B, S, V) and torch.isfinite(out.probs).all()
    assert torch.allclose(out.probs.sum(-1), torch.ones(B, S))
    assert (out.probs[:, :, 1::2] == 0).all()  # nothing outside the draft vocabulary
    drawn = out.probs.gather(-1, out.token_ids[..., None])[..., 0]
    assert (drawn > 0).all() and (drawn[1] == 1).all()  # the greedy row is one-hot
    # All-greedy batches (temperature None) draft deterministically.
    assert rule.propose(inputs(reduced=True)).probs is None


def test_nan_head_weight_at_run_time_falls_back_to_the_argmax(tmp_path):
    rule = build(draft_dir(tmp_path, random_head()))
    with torch.no_grad():
        rule.head.cell.weight_hh[0, 0] = math.nan
    x = inputs()
    out = rule.propose(x)
    assert out.faulty_rows.all()
    ids, _ = apply_fallback(x, out)
    assert torch.equal(ids, x.long_logits().argmax(-1))


def test_absolute_domino_path(tmp_path):
    folder = save_domino_head(tmp_path / "elsewhere" / "head", random_head(), torch.float32)
    rule = build_rule(LiliPropOptions(rule="domino", domino_path=str(folder)), resources(None))
    assert rule.head.config.rank == R


def test_missing_folder_names_domino_path_and_the_fix(tmp_path):
    with pytest.raises(OptionError, match=r"domino_path: no Domino head at .*export_domino"):
        build(tmp_path)
    with pytest.raises(OptionError, match="domino_path = 'domino' is relative"):
        build(None)


def test_nan_weights_on_disk_are_refused_naming_the_file(tmp_path):
    directory = draft_dir(tmp_path, random_head())
    weights = directory / "domino" / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["down.weight"][0, 0] = math.nan
    save_file(tensors, str(weights))
    with pytest.raises(ValueError, match=rf"{weights}: 'down.weight' holds 1 NaN/Inf"):
        build(directory)


def test_head_for_another_draft_vocabulary_or_width_is_refused(tmp_path):
    directory = draft_dir(tmp_path, random_head(torch.arange(1, V, 2)))
    with pytest.raises(ValueError, match="scores none of the draft's 24 ids"):
        build(directory, draft_vocab_ids=REDUCED)
    wide = resources(directory)
    wide.draft_hidden_size = 2 * H
    with pytest.raises(ValueError, match="hidden_size = 16 but the drafter is 32 wide"):
        build_rule(LiliPropOptions(rule="domino"), wide)
