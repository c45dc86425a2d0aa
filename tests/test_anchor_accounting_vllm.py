"""Acceptance counts under preemption and full rejections, step by step, with a negative control.

Output equality cannot see a mis-indexed anchor: vLLM's verification keeps the output right for
any draft. Acceptance can. The draft here is known in advance: a constant drafter with a DeLS
Markov head that chains a bigram table (a token's next token), so the block drafted from
anchor x is table[x], table[table[x]], ... Part of the table is deliberately wrong, which forces
steps where every draft is rejected. vLLM's per-request metrics (`detailed`) give every verify
step's accepted count; each must equal what that block, drafted from the request's true last
verified token, earns against the target's own greedy continuation. A preempted request is
recomputed from scratch, and the recompute samples one token without drafts, so a replay may
insert up to `num_preemptions` such one-token steps before any verify step; nothing else.
The control rolls the anchors across the batch (each request drafts from another's last token)
and must fail that replay.
"""

from collections import Counter
from pathlib import Path

import pytest
import torch

from tests.builders import build_constant_dflash
from tests.engine import ENGINE_FLAGS, most_common_token, unused_tokens

pytestmark = pytest.mark.vllm
K = 4
MAX_TOKENS = 24
PROMPTS = [f"x{i} = {i} * (" for i in range(96)]
TIGHT = {"max_num_seqs": 32, "num_gpu_blocks_override": 24, "max_model_len": 256, "block_size": 32}


def attach_bigram_head(draft_dir, target_dir, table: dict[int, int], vocab_size=1024, strength=50.0):
    """A Markov DeLS head (in `<draft_dir>/dels`) that puts `strength` on table[prev] after each
    prev in the table and is flat after any other token (the drafter's argmax then decides)."""
    from transformers import AutoTokenizer

    from vllm_liliprop.heads.dels import MarkovShortHead, UnigramPrior
    from vllm_liliprop.heads.dels_io import DelsConfig, save_dels_head, tokenizer_fingerprint

    head = MarkovShortHead(vocab_size, rank=len(table))
    with torch.no_grad():
        head.state_embed.weight.zero_()
        head.rank_to_vocab.weight.zero_()
        for axis, (prev, nxt) in enumerate(sorted(table.items())):
            head.state_embed.weight[prev, axis] = 1.0
            head.rank_to_vocab.weight[nxt, axis] = strength
    prior = UnigramPrior.from_counts(torch.zeros(vocab_size))
    fingerprint = tokenizer_fingerprint(AutoTokenizer.from_pretrained(target_dir))
    return save_dels_head(Path(draft_dir) / "dels", head, prior,
                          DelsConfig.for_head(head, prior, tokenizer_fingerprint=fingerprint))


def run(target, draft, flags, prepare=None):
    """Per request: (output ids, per-step accepted counts, preemptions)."""
    from vllm import LLM, SamplingParams

    from tests.engine import find_drafter, liliprop_env

    spec = None
    if draft is not None:
        spec = {"method": "dflash", "model": str(draft), "num_speculative_tokens": K}
    max_tokens = MAX_TOKENS if draft is not None else MAX_TOKENS + K
    with liliprop_env({"rule": "dels"} if draft is not None else None):
        detail = {"per_request_spec_decode_metrics": "detailed"} if spec else {}
        llm = LLM(model=str(target), speculative_config=spec, **dict(ENGINE_FLAGS, **detail, **flags))
        if prepare is not None:
            prepare(find_drafter(llm))
        outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=max_tokens,
                                                       ignore_eos=True), use_tqdm=False)
    rows = []
    for out in outputs:
        metrics = out.outputs[0].spec_decode_metrics
        rows.append((list(out.outputs[0].token_ids),
                     [] if metrics is None else list(metrics.per_step_accepted),
                     getattr(out.metrics, "num_preemptions", 0) if out.metrics else 0))
    metrics = {m.name: m.value for m in llm.get_metrics() if hasattr(m, "value")}
    del llm
    return rows, metrics


def chain(table, fallback, token):
    block = []
    for _ in range(K):
        token = table.get(token, fallback)
        block.append(token)
    return block


def earned(ys, p, block):
    """Drafts of `block` (drafted after ys[p]) that match the continuation ys[p + 1:]."""
    a = 0
    while a < K and ys[p + 1 + a] == block[a]:
        a += 1
    return a


def replays(ys, accepted, recomputes, draft_from):
    """Whether the per-step accepted counts fit this request: from position 0 (the prefill's
    token), each verify step at p earns earned(ys, p, draft_from(ys[p])) and moves to p + a + 1;
    up to `recomputes` one-token recompute steps may come before any verify step."""
    states = {(0, 0)}
    for a in accepted:
        states = {(p + extra + a + 1, used + extra)
                  for p, used in states for extra in range(recomputes - used + 1)
                  if p + extra < len(ys) - K and earned(ys, p + extra, draft_from(ys[p + extra])) == a}
        if not states:
            return False
    return True


@pytest.fixture(scope="module")
def setup(tiny_models):
    target = tiny_models["target"]
    plain, _ = run(target, None, {"max_model_len": 256})
    outputs = [ys for ys, _, _ in plain]
    # The constant drafter ranks a token the target never emits first (so the drafter alone
    # drafts nothing acceptable), the most common output token second.
    ranked = [unused_tokens(outputs, 1024, 1)[0], most_common_token(outputs), *unused_tokens(outputs, 1024, 3)[1:]]
    # The target's most common successor of each token, then every third entry made wrong.
    successors = {}
    for ys in outputs:
        for prev, nxt in zip(ys, ys[1:]):
            successors.setdefault(prev, Counter())[nxt] += 1
    table = {prev: counts.most_common(1)[0][0] for prev, counts in successors.items()}
    for i, prev in enumerate(sorted(table)):
        if i % 3 == 0:
            table[prev] = ranked[0]  # never in the outputs: the whole block is rejected
    draft = build_constant_dflash(tiny_models["root"] / "bigram", target, ranked)
    attach_bigram_head(draft, target, table)
    return {"target": target, "draft": draft, "outputs": outputs,
            "draft_from": lambda token: chain(table, ranked[0], token)}


def test_acceptance_per_step_is_the_drafts_own_under_preemption(setup):
    rows, metrics = run(setup["target"], setup["draft"], TIGHT)
    assert metrics["vllm:num_preemptions"] > 0
    outputs, draft_from = setup["outputs"], setup["draft_from"]
    assert [ys for ys, _, _ in rows] == [ys[:MAX_TOKENS] for ys in outputs]
    steps = [a for _, accepted, _ in rows for a in accepted]
    assert steps.count(0) > 20 and max(steps) == K  # full rejections and full acceptances
    assert sum(n for _, _, n in rows) > 0
    bad = [i for i, (_, accepted, n) in enumerate(rows)
           if not replays(outputs[i], accepted, n, draft_from)]
    assert bad == []

    # Without preemption the steps are exactly the predicted ones.
    rows, _ = run(setup["target"], setup["draft"], {"max_model_len": 256})
    assert all(n == 0 for _, _, n in rows)
    assert all(replays(outputs[i], accepted, 0, draft_from) for i, (_, accepted, _) in enumerate(rows))


def test_negative_control_a_wrong_anchor_fails_the_replay(setup):
    def roll_anchors(drafter):
        original = drafter.set_inputs_first_pass

        def set_inputs_first_pass(*args, **kwargs):
            result = original(*args, **kwargs)
            drafter._anchor_ids = drafter._anchor_ids.roll(1)
            return result

        drafter.set_inputs_first_pass = set_inputs_first_pass

    rows, _ = run(setup["target"], setup["draft"], TIGHT, prepare=roll_anchors)
    outputs, draft_from = setup["outputs"], setup["draft_from"]
    assert [ys for ys, _, _ in rows] == [ys[:MAX_TOKENS] for ys in outputs]  # output still exact
    bad = [i for i, (_, accepted, n) in enumerate(rows)
           if not replays(outputs[i], accepted, n, draft_from)]
    assert len(bad) > len(rows) // 4
