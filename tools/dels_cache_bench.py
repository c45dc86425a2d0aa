"""DeLS draft cost with the head's weights in cache and out of it (issue 19): what bounds it.

    python -m tools.dels_cache_bench --target .cache/targets/smollm2-135m-instruct \
        --drafter testbed/smollm2/round3/drafts/dflash --repeats 50

For each shipped DeLS head (DRAFTER/dels, DRAFTER/dels_markov) the real rule (rules/dels.py,
over the drafter's reduced vocabulary) drafts one row of 3 slots from random long logits:
"warm" repeats the call back to back; "cold" first sweeps 300 MB (as the target's 270 MB
forward does between two draft steps on this CPU), so the head's weights come from DRAM.
Then the head's largest matrix-vector product, the vocabulary projection, in the layouts and
dtypes that could read it faster, with whether each gives bit-identical logits to the served
fp32 row-major product (only bit-identical ones keep every draft unchanged).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from vllm_liliprop.heads.dels_io import load_dels_head
from vllm_liliprop.rules.dels import DelsRule
from vllm_liliprop.rules.dels_draft import dels_draft


def _timed(fn, repeats: int, sweep: torch.Tensor | None) -> float:
    """Mean ms of fn over repeats; with `sweep`, each call follows a pass over it (cold caches)."""
    for _ in range(5):
        fn()
    total = 0.0
    for _ in range(repeats):
        if sweep is not None:
            sweep.sum()
        start = time.perf_counter()
        fn()
        total += time.perf_counter() - start
    return 1000 * total / repeats


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.dels_cache_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True, help="DFlash draft folder holding dels/ and dels_markov/")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    embed = load_file(str(Path(args.target) / "model.safetensors"))["model.embed_tokens.weight"]
    draft = load_file(str(Path(args.drafter) / "model.safetensors"))
    n = int(draft["d2t"].numel())
    vocab_ids = torch.arange(n) + draft["d2t"].long()
    sweep = torch.ones(300 * 2**20 // 4)
    print(f"{'head':12s} {'warm ms':>8s} {'cold ms':>8s}  (one row, 3 slots, {n}-token draft vocabulary)")
    for kind in ("dels", "dels_markov"):
        head, prior, config = load_dels_head(Path(args.drafter) / kind, embed, embed.shape[0], None)
        rule = DelsRule(head.eval(), prior.log_probs, [0.3] * 3, [0.3] * 3, config.pure_draft_prefix_len,
                        "deterministic", vocab_ids)
        long_logits, anchor = torch.randn(1, 3, n), torch.randint(0, embed.shape[0], (1,))

        def draft_once():
            with torch.inference_mode():
                return dels_draft(long_logits, anchor, rule.head, rule.log_prior, rule.alpha, rule.beta,
                                  pure_draft_prefix_len=rule.pure_draft_prefix_len, vocab_ids=rule.vocab_ids)

        print(f"{kind:12s} {_timed(draft_once, args.repeats, None):8.3f} {_timed(draft_once, args.repeats, sweep):8.3f}")
    weight = rule.head.weight.float()  # the Markov head's [N, r] vocabulary rows, as served
    state = torch.randn(1, weight.shape[1])
    served = F.linear(state, weight)
    variants = {
        "fp32 [N, r] (served)": (lambda: F.linear(state, weight)),
        "fp32 [r, N] transposed": (lambda w=weight.t().contiguous(): state @ w),
        "bf16 [N, r]": (lambda w=weight.bfloat16(), s=state.bfloat16(): F.linear(s, w)),
        "fp32 [N, r] after a streaming touch": (lambda: (weight.sum(), F.linear(state, weight))[1]),
    }
    print(f"\nvocabulary projection {tuple(weight.shape)}: cold ms, bit-identical to the served product")
    for name, fn in variants.items():
        same = torch.equal(fn().float(), served)
        print(f"  {name:38s} {_timed(fn, args.repeats, sweep):7.3f}  {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
