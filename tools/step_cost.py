"""Where a speculative step's fixed cost goes: AR and DFlash at k speculative tokens, side by side.

    source scripts/env.sh
    python -m tools.step_cost --target .cache/targets/smollm2-135m-instruct \
        --draft testbed/smollm2/round3/drafts/dflash --concurrency 1 --ks 1,3 --rounds 2
    VLLM_PLUGINS= python -m tools.step_cost ...   # the same with vLLM's own DFlashProposer
    python -m tools.step_cost ... --ks "" --plain-steps --concurrency 16   # the k = 0 step
    python -m tools.step_cost ... --ks 3 --vllm-verify --concurrency 16    # patches 12-13 on / off
    python -m tools.step_cost ... --ks 3 --vllm-verify --temperature 1     # T = 1 (--seeded: a seed each)
    python -m tools.step_cost ... --ks 3 --sampled-k0 --temperature 1      # option sampled_k = 0

One in-process engine per arm (AR, then k = each of --ks), built in turn in one process and run
--rounds times in that order, so the arms share the machine's state; each arm generates
--tokens tokens (ignore_eos) for --concurrency synthetic prompts of 100 token ids. Printed: ms
per engine step of the engine step and of each wrapped method of vLLM 0.32's runner
(`GPUModelRunner`) and drafter (`DFlashProposer`), the median over rounds. Needs
VLLM_ENABLE_V1_MULTIPROCESSING=0 (scripts/env.sh sets it). Methods nest: `drafter.propose`
holds the drafter rows, `runner.execute_model` the target's forward, LM head and input
preparation, `runner.sample_tokens` the rejection sampler and the proposal.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import gc
import time
from collections.abc import Sequence

from vllm_liliprop.host import fast_dtype

RUNNER_METHODS = ("execute_model", "sample_tokens", "_sample", "_model_forward", "_prepare_inputs",
                  "_update_states", "propose_draft_token_ids", "_bookkeeping_sync",
                  "_calc_spec_decode_metadata")
DRAFTER_METHODS = ("propose", "set_inputs_first_pass", "build_per_group_and_layer_attn_metadata",
                   "build_model_inputs_first_pass", "_sample_draft_tokens", "_greedy_sample")
DRAFT_MODEL_METHODS = (("forward", "drafter.model.forward"),
                       ("precompute_and_store_context_kv", "drafter.precompute_context_kv"),
                       ("combine_hidden_states", "drafter.combine_hidden_states"))


def _wrap(owner, name: str, seconds: collections.Counter, key: str) -> None:
    if owner is None or not hasattr(owner, name):
        return
    original = getattr(owner, name)

    @functools.wraps(original)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            seconds[key] += time.perf_counter() - start

    owner.__dict__[name] = timed


# Arms of --plain-steps: a speculative engine (k = 1) whose schedule drafts nothing at any batch
# size, each with these proposer class settings: the step handed over by the runner (patch 14),
# the same context-only step through vLLM's path to propose(), and vLLM's full query pass.
PLAIN_STEP_ARMS = {"k=0 handed over": {},
                   "k=0 context only, vLLM's path": {"plain_steps_from_runner": False},
                   "k=0 query pass": {"skip_plain_step_queries": False}}


@contextlib.contextmanager
def vllm_verify(on: bool):
    """vLLM's own verification (patches 12 and 13 undone: greedy argmax, recovered tokens)
    while `on`."""
    from vllm.v1.sample import rejection_sampler

    from vllm_liliprop.vllm.patching import apply_patches

    apply_patches()  # idempotent; an engine's start would apply them after this swap
    owners = ((rejection_sampler.RejectionSampler, "forward"), (rejection_sampler, "sample_recovered_tokens"))
    patched = [vars(owner)[name] for owner, name in owners]
    if on:
        for (owner, name), current in zip(owners, patched):
            setattr(owner, name, getattr(current, "__liliprop_original__", current))
    try:
        yield
    finally:
        for (owner, name), current in zip(owners, patched):
            setattr(owner, name, current)


def measure_arm(target: str, draft: str | None, k: int, concurrency: int, tokens: int,
                plain_steps: dict | None = None, temperature: float = 0.0,
                seeded: bool = False, options: dict | None = None,
                dtype: str = "bfloat16") -> dict[str, float]:
    """ms per engine step of each timed method for one engine (k = 0: plain decoding;
    plain_steps: a speculative engine at k = 0 throughout, with these LiliPropProposer class
    settings (PLAIN_STEP_ARMS); options: this package's draft-rule options)."""
    from vllm import LLM, SamplingParams

    from vllm_liliprop.vllm.offline import liliprop_options_env
    from vllm_liliprop.vllm.proposer import LiliPropProposer

    spec = None if k == 0 else {"method": "dflash", "model": draft, "num_speculative_tokens": k}
    saved = {name: getattr(LiliPropProposer, name) for name in plain_steps or {}}
    if plain_steps is not None:
        spec = {"method": "dflash", "model": draft, "num_speculative_tokens": 1,
                "num_speculative_tokens_per_batch_size": [[1, 1024, 0]]}
        for name, value in plain_steps.items():
            setattr(LiliPropProposer, name, value)
    with liliprop_options_env(options):
        llm = LLM(target, dtype=dtype, max_model_len=2048, enforce_eager=True, seed=0,
                  speculative_config=spec, max_num_seqs=concurrency)
    engine = llm.llm_engine
    runner = engine.model_executor.driver_worker.worker.model_runner
    seconds: collections.Counter = collections.Counter()
    for name in RUNNER_METHODS:
        _wrap(runner, name, seconds, f"runner.{name}")
    _wrap(runner.model, "compute_logits", seconds, "target.compute_logits")
    drafter = getattr(runner, "drafter", None)
    if drafter is not None:
        for name in DRAFTER_METHODS:
            _wrap(drafter, name, seconds, f"drafter.{name}")
        for name, key in DRAFT_MODEL_METHODS:
            _wrap(drafter.model, name, seconds, key)
    prompts = [{"prompt_token_ids": list(range(1000 + 7 * i, 1100 + 7 * i))} for i in range(concurrency)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    seconds.clear()
    for i, prompt in enumerate(prompts):
        engine.add_request(f"probe-{i}", prompt, SamplingParams(temperature=temperature, max_tokens=tokens,
                                                                ignore_eos=True, seed=i if seeded else None))
    steps = produced = 0
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                produced += len(output.outputs[0].token_ids)
        steps += 1
    wall = time.perf_counter() - start
    row = {"engine.step": 1000 * wall / steps, "tokens/step": produced / steps}
    row.update({key: 1000 * value / steps for key, value in seconds.items()})
    del llm, engine, runner, drafter
    gc.collect()
    for name, value in saved.items():
        setattr(LiliPropProposer, name, value)
    return row


# --sampled-k0's options: no draft for a sampled request at any batch size (sampled_drafts.py).
SAMPLED_K0 = {"rule": "argmax", "sampled_k": [[1, 1024, 0]]}


def main(argv: Sequence[str] | None = None) -> int:
    import pandas as pd

    parser = argparse.ArgumentParser(prog="python -m tools.step_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True, help="a DFlash draft folder")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--ks", default="1,3", help="speculative token counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=300, help="tokens generated per prompt")
    parser.add_argument("--temperature", type=float, default=0.0, help="of the timed requests")
    parser.add_argument("--seeded", action="store_true", help="a seed per request (vLLM then draws its noise per row)")
    parser.add_argument("--vllm-verify", action="store_true",
                        help="also each k with vLLM's own verification (patches 12 and 13 undone)")
    parser.add_argument("--plain-steps", action="store_true",
                        help="also a speculative engine at k = 0 throughout, with and without "
                             "the drafter's query pass (vllm_liliprop/vllm/proposer.py)")
    parser.add_argument("--sampled-k0", action="store_true",
                        help="also each k with option sampled_k = 0 (sampled requests draft nothing)")
    parser.add_argument("--dtype", default=None,
                        help="the target's dtype (default: the host probe's choice, host.fast_dtype)")
    args = parser.parse_args(argv)
    dtype = args.dtype or fast_dtype()
    arms = {"AR": (0, None, False, None)}
    for k in filter(None, args.ks.split(",")):
        arms[f"k={k}"] = (int(k), None, False, None)
        if args.vllm_verify:
            arms[f"k={k} vLLM verify"] = (int(k), None, True, None)
        if args.sampled_k0:
            arms[f"k={k} sampled_k 0"] = (int(k), None, False, SAMPLED_K0)
    if args.plain_steps:
        arms.update({name: (1, settings, False, None) for name, settings in PLAIN_STEP_ARMS.items()})
    rows: dict[str, list[dict]] = collections.defaultdict(list)
    for _ in range(args.rounds):
        for name, (k, plain_steps, stock_verify, options) in arms.items():
            with vllm_verify(stock_verify):
                rows[name].append(measure_arm(args.target, args.draft, k, args.concurrency,
                                              args.tokens, plain_steps, args.temperature,
                                              args.seeded, options, dtype))
    table = pd.DataFrame({arm: pd.DataFrame(values).median() for arm, values in rows.items()})
    pd.set_option("display.width", 200)
    print(f"ms per engine step, median of {args.rounds} rounds, c = {args.concurrency}, "
          f"T = {args.temperature}, {dtype}")
    print(table.round(2).to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
