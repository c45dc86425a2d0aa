"""Does a system keep the target's sampling distribution? A chi-square test against plain decoding.

    python -m eval distribution --target DIR --systems F --var drafts=D --only DFlash,LiLiCorr-greedy \\
        --benchmark humaneval --data-dir .cache/benchmarks --samples 1500 --tokens 3

One prompt (the benchmark's first, through the chat template) is sampled `samples` times at
temperature 1 with a different seed per sample, by AR and by each system; the joint distribution
of the first `tokens` generated tokens is compared by a chi-square test of homogeneity (rare
tuples pooled). A lossless system gives p-values spread uniformly over (0, 1); a bias in the drafted
tokens' distribution drives p towards 0. AR's samples use seeds 0..N-1, each system's N..2N-1.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from eval.prompts import PromptRenderer


def chi_square_p(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]], min_count: int = 10) -> float:
    """p-value of 'same distribution' for two samples of token tuples; tuples seen fewer than
    `min_count` times in both samples together are pooled into one cell."""
    from scipy.stats import chi2_contingency

    ca, cb = Counter(map(tuple, a)), Counter(map(tuple, b))
    keys = [k for k in set(ca) | set(cb) if ca[k] + cb[k] >= min_count]
    table = [[ca[k] for k in keys], [cb[k] for k in keys]]
    table[0].append(len(a) - sum(table[0]))
    table[1].append(len(b) - sum(table[1]))
    return float(chi2_contingency(table)[1])


def sample_tuples(engine, render, prompt: str, samples: int, tokens: int, first_seed: int, offline):
    """`samples` sampled continuations of `prompt` (T = 1), `tokens` tokens each, one seed each."""
    result = engine.run_batch([[prompt]] * samples, render,
                              offline.Sampling(1.0, tokens, first_seed, ignore_eos=True), max_turns=1)
    return [ids[0] for ids in result.token_ids], result.counters


def distribution_check(target: str, systems, prompt: str, engine_flags: dict, samples: int = 1500,
                       tokens: int = 3, concurrency: int = 64, log=print) -> list[dict]:
    from vllm_liliprop.vllm import offline

    from transformers import AutoTokenizer

    render = PromptRenderer(AutoTokenizer.from_pretrained(target))
    rows, plain = [], None
    for system in systems:
        with offline.OfflineEngine(target, engine_flags, system.speculative_config, system.options(),
                                   max_num_seqs=concurrency,
                                   without_liliprop=system.without_liliprop) as engine:
            first_seed = 0 if system.is_baseline else samples
            drawn, counters = sample_tuples(engine, render, prompt, samples, tokens, first_seed, offline)
        if system.is_baseline:
            plain = drawn
            continue
        p = chi_square_p(drawn, plain)
        rows.append({"system": system.name, "samples": samples, "tokens": tokens, "p_value": p,
                     "distinct_tuples": len(set(map(tuple, drawn))), "tau": counters.tau})
        log(f"{system.name}: chi-square p = {p:.3g} over {samples} samples of {tokens} tokens "
            f"(tau {counters.tau:.2f})")
    return rows
