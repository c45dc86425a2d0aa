"""Train/serve consistency: the training drafter drafts exactly the tokens vLLM's DFlash drafts.

The drafter (and LiLiCorr head) is exported by training/export.py and served by vLLM. We record
the draft token ids of every proposal vLLM makes, then replay the same decode with the PyTorch
training modules (context = every verified token before the anchor, anchor = the last verified
token, head inputs as training.objective builds them) and require identical drafts at every step.
"""

import pytest
import torch
import torch.nn.functional as F

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPT_IDS = [[400, 37, 512, 9, 88, 700, 23, 5, 64, 301, 12, 800], [15, 16, 17, 18, 19, 20, 21, 22]]


def _record_drafts(target_dir, draft_dir, monkeypatch, options=None):
    """Serve `draft_dir` and return (outputs, recorded proposals) per prompt in PROMPT_IDS."""
    import json

    from tests.engine import ENGINE_FLAGS, find_drafter

    # Plugins load once per process, so the project's plugin may be active; without options
    # it drafts exactly like stock DFlash (tests/test_plugin_vllm.py).
    if options is None:
        monkeypatch.delenv("VLLM_LILIPROP_OPTIONS", raising=False)
    else:
        monkeypatch.setenv("VLLM_LILIPROP_OPTIONS", json.dumps(options))
    from vllm import LLM, SamplingParams

    llm = LLM(model=target_dir, speculative_config={
        "method": "dflash", "model": str(draft_dir), "num_speculative_tokens": 7}, **ENGINE_FLAGS)
    proposer = find_drafter(llm)
    recorded = []
    real_propose = proposer.propose

    def recording_propose(*args, **kwargs):
        drafts = real_propose(*args, **kwargs)
        recorded[-1].append(torch.as_tensor(drafts).tolist())
        return drafts

    monkeypatch.setattr(proposer, "propose", recording_propose)
    outputs = []
    for prompt in PROMPT_IDS:
        recorded.append([])
        out = llm.generate([{"prompt_token_ids": prompt}],
                           SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
        outputs.append(list(out[0].outputs[0].token_ids))
    del llm
    return outputs, recorded, proposer


def _replay(target_dir, drafter, outputs, recorded, draft_fn):
    """Walk the decode vLLM made; at every proposal compare draft_fn's drafts to vLLM's."""
    from transformers import AutoModelForCausalLM

    from training.features import frozen_target_weights, target_hidden_states

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    embed, lm_head = frozen_target_weights(target)
    config = drafter.config
    steps = 0
    for prompt, ys, proposals in zip(PROMPT_IDS, outputs, recorded):
        sequence = torch.tensor([prompt + ys])
        taps = target_hidden_states(target, sequence, torch.ones_like(sequence), config.target_layer_ids,
                                    final_hidden=False)["target_taps"]
        with torch.no_grad():
            context = drafter.context_states(taps)
        p = 0  # ys[p] is the last verified token: the anchor of the next proposal
        for vllm_drafts in proposals:
            anchor = len(prompt) + p
            block = torch.full((1, 1, config.block_size), config.mask_token_id)
            block[0, 0, 0] = sequence[0, anchor]
            with torch.no_grad():
                hidden = drafter(F.embedding(block, embed), context, torch.tensor([[anchor]]))
                ours = draft_fn(hidden[0, :, 1:], context[:, anchor - 1], embed, lm_head)
            assert ours == vllm_drafts[0][:7], f"step {steps}: anchor position {anchor}"
            accepted = 0
            while accepted < 7 and p + 1 + accepted < len(ys) and ours[accepted] == ys[p + 1 + accepted]:
                accepted += 1
            p += accepted + 1
            steps += 1
            if p >= len(ys) - 1:
                break
    return steps


def _random_drafter(target_dir):
    from transformers import AutoConfig, AutoTokenizer

    from training.drafter import DFlashDrafter, DrafterConfig

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    torch.manual_seed(3)
    config = DrafterConfig.from_target(
        AutoConfig.from_pretrained(target_dir), mask_token_id=tokenizer.convert_tokens_to_ids("<|mask|>"),
        num_hidden_layers=2, target_layer_ids=[1, 3], block_size=8)
    drafter = DFlashDrafter(config)
    drafter.reset_parameters(std=0.08)  # a random drafter with decisive argmaxes
    return drafter.eval()


def test_vllm_drafts_equal_training_drafter_drafts(tiny_models, tmp_path, monkeypatch):
    from training.export import export_dflash

    drafter = _random_drafter(tiny_models["target"])
    export_dflash(tmp_path / "draft", drafter, dtype=torch.float32)
    from vllm.v1.spec_decode.dflash import DFlashProposer

    outputs, recorded, proposer = _record_drafts(tiny_models["target"], tmp_path / "draft", monkeypatch)
    assert isinstance(proposer, DFlashProposer)
    assert getattr(proposer, "draft_rule", None) is None  # stock argmax drafting

    def argmax(slot_hidden, anchor_hidden, embed, lm_head):
        return (slot_hidden[0] @ lm_head.T).argmax(-1).tolist()

    assert _replay(tiny_models["target"], drafter, outputs, recorded, argmax) >= 10


@pytest.mark.parametrize("options", [None, {"walk": "greedy"}], ids=["stock", "plugin-rule"])
def test_reduced_vocabulary_drafts_are_the_argmax_over_that_vocabulary(tiny_models, tmp_path, monkeypatch,
                                                                       options):
    """A DFlash draft exported with a draft vocabulary (draft_vocab_size, lm_head, d2t) drafts,
    through vLLM's mapping, exactly the training drafter's argmax over those ids, in stock vLLM
    and through the plugin's rule path; and no draft leaves the vocabulary."""
    from training.export import export_dflash, read_draft_vocab
    from transformers import AutoModelForCausalLM

    from training.features import frozen_target_weights

    drafter = _random_drafter(tiny_models["target"])
    target = AutoModelForCausalLM.from_pretrained(tiny_models["target"], dtype=torch.float32)
    _, lm_head = frozen_target_weights(target)
    vocab = torch.arange(0, lm_head.shape[0], 3)  # every third id: the full argmax often falls outside
    export_dflash(tmp_path / "draft", drafter, dtype=torch.float32, draft_vocab=(vocab, lm_head))
    assert torch.equal(read_draft_vocab(tmp_path / "draft"), vocab)
    outputs, recorded, proposer = _record_drafts(tiny_models["target"], tmp_path / "draft", monkeypatch, options)
    assert (getattr(proposer, "draft_rule", None) is None) == (options is None)
    assert all(t % 3 == 0 for steps in recorded for block in steps for row in block for t in row)

    def argmax_in_vocab(slot_hidden, anchor_hidden, embed, lm_head):
        return vocab[(slot_hidden[0] @ lm_head[vocab].T).argmax(-1)].tolist()

    assert _replay(tiny_models["target"], drafter, outputs, recorded, argmax_in_vocab) >= 10


def test_plugin_lattice_drafts_equal_training_objective_inputs(tiny_models, tmp_path, monkeypatch):
    """The LiLiCorr head fed as DraftObjective feeds it in training (top-K ids, full-vocabulary
    log-probs, final-normed slot states, hidden_norm(fc(taps)) before the anchor) and walked
    greedily reproduces the drafts the project's vLLM plugin serves from the exported dir."""
    from training.export import export_lilicorr
    from training.pipeline import build_lattice
    from vllm_liliprop.heads.candidates import topk_candidates
    from vllm_liliprop.walks import greedy_walk

    drafter = _random_drafter(tiny_models["target"])
    torch.manual_seed(4)
    lattice = build_lattice({"candidate_topk": 4, "hidden_size": 64, "num_layers": 1, "num_heads": 2,
                             "factor_dim": 32}, drafter.config).eval()
    with torch.no_grad():  # decisive random scores
        for name, param in lattice.named_parameters():
            if param.dim() >= 2 or "embedding" in name:
                param.normal_(0.0, 0.3)
    export_lilicorr(tmp_path / "lilicorr", drafter, lattice, dtype=torch.float32)
    outputs, recorded, proposer = _record_drafts(tiny_models["target"], tmp_path / "lilicorr", monkeypatch,
                                                 options={"walk": "greedy"})
    assert proposer.draft_rule.name == "lattice-greedy"

    def lattice_walk(slot_hidden, anchor_hidden, embed, lm_head):
        logits = slot_hidden[0] @ lm_head.T  # [S, V]
        ids, log_probs = topk_candidates(logits, 4)
        start, pairs = lattice.score(F.embedding(ids, embed)[None], log_probs[None], slot_hidden,
                                     anchor_hidden, torch.ones(1, dtype=torch.bool))
        return ids.gather(-1, greedy_walk(start, pairs)[0][:, None])[:, 0].tolist()

    assert _replay(tiny_models["target"], drafter, outputs, recorded, lattice_walk) >= 10


def test_regeneration_through_a_vllm_engine(tiny_models, tmp_path, monkeypatch):
    import json

    from training.regenerate import regenerate_conversations, vllm_chat_generator

    generate = vllm_chat_generator(tiny_models["target"], max_tokens=6, max_model_len=256,
                                   dtype="float32", enforce_eager=True)
    conversations = [{"id": f"c{i}", "messages": [
        {"role": "user", "content": f"def f{i}():"}, {"role": "assistant", "content": "stale"},
        {"role": "user", "content": "and then"}]} for i in range(3)]
    out = tmp_path / "regen.jsonl"
    assert regenerate_conversations(conversations, generate, out, chunk_size=2, progress=False) == 3
    assert regenerate_conversations(conversations, generate, out, chunk_size=2, progress=False) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["c0", "c1", "c2"]
    for row in rows:
        roles = [m["role"] for m in row["messages"]]
        assert roles == ["user", "assistant", "user", "assistant"]
        assert row["messages"][1]["content"] != "stale"
    # Greedy and deterministic: the same history gives the same reply.
    assert generate([rows[0]["messages"][:1]]) == [rows[0]["messages"][1]["content"]]
