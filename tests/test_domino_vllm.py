"""Domino drafts (dflash_config.liliprop = {"rule": "domino"} + a `domino/` head folder) in real
vLLM engines: greedy output is plain decoding's, the drafts are `sequential_draft` of the
head on the drafter's states recomputed outside vLLM, a head turning NaN falls back without a
trace in the output, bad or missing head folders stop the engine at start with the file named.

Engines: full vocabulary, NaN at run time, reduced vocabulary, NaN on disk, missing folder.
"""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.engine import counters_list, error_chain, generate, plain32, recording
from vllm_liliprop.heads.domino import DominoConfig, DominoHead, load_domino_head, save_domino_head
from vllm_liliprop.heads.sequential import sequential_draft

pytestmark = pytest.mark.vllm
V = 1024


def target_weights(target_dir) -> dict[str, torch.Tensor]:
    return load_file(str(Path(target_dir) / "model.safetensors"))


def random_head(target_dir, vocab_ids=None, seed=0) -> DominoHead:
    """A random head whose residual is about as large as the drafter's logits (std ~1)."""
    embed = target_weights(target_dir)["model.embed_tokens.weight"]
    torch.manual_seed(seed)
    vocab_ids = torch.arange(V) if vocab_ids is None else vocab_ids
    head = DominoHead(DominoConfig(V, embed.shape[1], 128, 16), embed, vocab_ids)
    with torch.no_grad():
        torch.nn.init.normal_(head.down.weight, std=128 ** -0.5)
        torch.nn.init.normal_(head.up.weight, std=0.5)
    return head


def name_the_rule(draft_dir: Path) -> None:
    path = draft_dir / "config.json"
    config = json.loads(path.read_text())
    config["dflash_config"]["liliprop"] = {"rule": "domino", "domino_path": "domino"}
    path.write_text(json.dumps(config, indent=2))


@pytest.fixture(scope="module")
def domino_draft(tiny_models):
    """The stock tiny drafter with a random Domino head."""
    draft = Path(tiny_models["root"]) / "domino-full"
    shutil.copytree(tiny_models["draft"], draft)
    save_domino_head(draft / "domino", random_head(tiny_models["target"]), torch.float32)
    name_the_rule(draft)
    return draft


def check_against_reference(records, target_dir, head_dir, vocab_ids=None) -> float:
    """Every recorded block is sequential_draft of the head (loaded afresh from its folder) on the
    recorded states, with the drafter's logits recomputed from the target's LM head. Returns the
    fraction of slots where the drafts differ from the drafter's argmax."""
    weights = target_weights(target_dir)
    lm_head = weights["lm_head.weight"].float()
    if vocab_ids is not None:
        lm_head = lm_head[vocab_ids]
    head = load_domino_head(head_dir, weights["model.embed_tokens.weight"])
    changed = total = 0
    with torch.inference_mode():
        for step in records:
            base = step["hidden"].float() @ lm_head.T
            ids, faulty = sequential_draft(base, step["anchor"], step["hidden"], head,
                                           vocab_ids=vocab_ids)
            if vocab_ids is not None:
                ids, argmax = vocab_ids[ids], vocab_ids[base.argmax(-1)]
            else:
                argmax = base.argmax(-1)
            assert not faulty.any() and not step["faulty"].any()
            assert torch.equal(step["ids"], ids)
            changed += int((ids != argmax).sum())
            total += ids.numel()
    return changed / total


def test_domino_drafts_are_the_heads_and_greedy_output_is_plain(tiny_models, stock, domino_draft):
    records = []
    ids, counters, drafter = generate(tiny_models["target"], domino_draft, prepare=recording(records))
    assert drafter.draft_rule.name == "domino" and drafter.draft_rule.vocab_ids is None
    assert drafter.liliprop_options.sources["rule"] == "checkpoint"
    assert ids == plain32(stock)
    assert drafter.num_rule_faults == 0
    assert len(records) >= 4 and counters.num_accepted_tokens > 0
    changed = check_against_reference(records, tiny_models["target"], domino_draft / "domino")
    assert 0.1 < changed < 1.0, changed  # the head moves some drafts, not all


def test_nan_head_at_run_time_falls_back_without_changing_the_output(tiny_models, stock,
                                                                     domino_draft):
    def poison(drafter):
        with torch.inference_mode():
            drafter.draft_rule.head.cell.weight_hh.fill_(math.nan)

    ids, counters, drafter = generate(tiny_models["target"], domino_draft, prepare=poison)
    assert drafter.num_rule_faults > 0
    assert ids == plain32(stock)
    # Every row fell back to the stock drafter's argmax: stock DFlash, counter for counter.
    assert counters_list(counters) == stock["dflash"]["counters"]


def test_reduced_vocabulary_domino_export(tiny_models, stock):
    """export_domino with a draft vocabulary: the head scores those ids only, drafts map back."""
    from training.export import export_domino, load_dflash, read_draft_vocab

    target = tiny_models["target"]
    lm_head = target_weights(target)["lm_head.weight"]
    plain = stock["plain"]["ids"]
    vocab = torch.tensor(sorted(set(range(0, V, 3)) | {t for ys in plain for t in ys}))
    draft = Path(tiny_models["root"]) / "domino-reduced"
    export_domino(draft, load_dflash(tiny_models["draft"]), random_head(target, vocab, seed=1),
                  torch.float32, draft_vocab=(vocab, lm_head))
    assert torch.equal(read_draft_vocab(draft), vocab)
    records = []
    ids, counters, drafter = generate(target, draft, prepare=recording(records))
    rule = drafter.draft_rule
    assert rule.name == "domino" and torch.equal(rule.vocab_ids.cpu(), vocab)
    assert rule.head.up.weight.shape[0] == vocab.numel()
    assert ids == plain32(stock)
    assert drafter.num_rule_faults == 0 and counters.num_drafts > 0
    assert all(bool(torch.isin(step["ids"], vocab).all()) for step in records)
    changed = check_against_reference(records, target, draft / "domino", vocab_ids=vocab)
    assert 0.1 < changed < 1.0, changed


def test_nan_head_weights_on_disk_stop_the_engine_naming_the_file(tiny_models, domino_draft):
    draft = Path(tiny_models["root"]) / "domino-nan"
    shutil.copytree(domino_draft, draft)
    weights = draft / "domino" / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["up.weight"][3, 1] = math.nan
    save_file(tensors, str(weights))
    with pytest.raises(Exception) as error:
        generate(tiny_models["target"], draft, max_tokens=4, prompts=["x"])
    text = error_chain(error.value)
    assert f"{weights}: 'up.weight' holds 1 NaN/Inf value(s)" in text, text
    assert "retrain or re-export it" in text, text


def test_missing_domino_folder_stops_the_engine_with_the_fix(tiny_models, domino_draft):
    draft = Path(tiny_models["root"]) / "domino-missing"
    shutil.copytree(domino_draft, draft)
    shutil.rmtree(draft / "domino")
    with pytest.raises(Exception) as error:
        generate(tiny_models["target"], draft, max_tokens=4, prompts=["x"])
    text = error_chain(error.value)
    assert f"domino_path: no Domino head at {draft / 'domino'}" in text, text
    assert "export_domino" in text, text


def test_sampled_domino_drafts_run_with_their_distributions(tiny_models, domino_draft):
    """sampling = probabilistic: the rule draws each slot and hands vLLM's rejection sampler the
    distributions (finite, over the vocabulary); the engine serves every request in full."""
    seen = []

    def prepare(drafter):
        rule = drafter.draft_rule
        real = rule.propose

        def propose(inputs):
            output = real(inputs)
            seen.append(output.probs is not None and bool(torch.isfinite(output.probs).all()))
            return output

        rule.propose = propose

    ids, counters, drafter = generate(tiny_models["target"], domino_draft, temperature=0.8,
                                      seeds=list(range(5)), options={"sampling": "probabilistic"},
                                      prepare=prepare)
    assert drafter.draft_rule.name == "domino-sampled"
    assert seen and all(seen) and drafter.num_rule_faults == 0
    assert [len(ys) for ys in ids] == [32] * 5 and counters.num_drafts > 0
