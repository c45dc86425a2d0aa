"""k = 0 engines of several scheduled systems against plain decoding at T = 1 (every request
sampled, so no system drafts): ms per engine step and per runner/drafter method, rounds in
rotating order. Why: Domino-confident ran 3-4% under AR at c = 16 and 32, T = 1, in 10 of 12 batches.
usage: python testbed/smollm2/schedule/avx2/k0_engines_ab.py C ROUNDS SYSTEM... (source scripts/env.sh; PYTHONPATH=.)"""
import collections, json, sys, time, gc, statistics
from eval.systems import load_systems
from tools.step_cost import _wrap, RUNNER_METHODS, DRAFTER_METHODS
from vllm_liliprop.vllm.offline import liliprop_options_env

c, rounds, names = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
T = ".cache/targets/smollm2-135m-instruct"
catalog = load_systems("testbed/smollm2/schedule/avx2/systems.json", {"drafts": "testbed/smollm2/round3/drafts"})

def arm(name):
    from vllm import LLM, SamplingParams
    spec, options = None, None
    if name != "AR":
        system, _ = catalog.get(name)
        spec, options = system.speculative_config, system.options()
    with liliprop_options_env(options):
        llm = LLM(T, dtype="float32", max_model_len=2048, enforce_eager=True, seed=0,
                  speculative_config=spec, max_num_seqs=c)
    engine = llm.llm_engine
    runner = engine.model_executor.driver_worker.worker.model_runner
    seconds = collections.Counter()
    for m in RUNNER_METHODS:
        _wrap(runner, m, seconds, f"runner.{m}")
    drafter = getattr(runner, "drafter", None)
    if drafter is not None:
        for m in DRAFTER_METHODS + ("keep_plain_step",):
            _wrap(drafter, m, seconds, f"drafter.{m}")
    prompts = [{"prompt_token_ids": list(range(1000 + 7 * i, 1100 + 7 * i))} for i in range(c)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    seconds.clear()
    for i, p in enumerate(prompts):
        engine.add_request(f"p-{i}", p, SamplingParams(temperature=1.0, max_tokens=120, ignore_eos=True))
    steps = 0
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step(); steps += 1
    row = {"engine.step": 1000 * (time.perf_counter() - start) / steps}
    row.update({k: 1000 * v / steps for k, v in seconds.items()})
    if drafter is not None:
        row["sampled_context_skips"] = getattr(drafter, "num_sampled_context_skips", None)
        row["context_only_steps"] = getattr(drafter, "num_context_only_steps", None)
        row["steps"] = steps
    del llm, engine, runner, drafter; gc.collect()
    return row

rows = []
arms = ["AR"] + names
for r in range(rounds):
    order = arms[r % len(arms):] + arms[:r % len(arms)]
    for name in order:
        row = arm(name); row.update(arm=name, round=r); rows.append(row)
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
json.dump(rows, open(f".cache/k0_engines_c{c}.json", "w"))
for name in arms:
    got = [x for x in rows if x["arm"] == name]
    print(name, {k: round(statistics.median([g.get(k, 0) or 0 for g in got]), 3) for k in got[0] if k not in ("arm", "round")})
