"""A system's step split into stages at batch 1, and optionally op by op (torch profiler).

    source scripts/env.sh
    python -m tools.stage_profile AR 0
    python -m tools.stage_profile DFlash 3 --ops     # + the matmuls by shape

One in-process engine (float32, testbed/smollm2 systems and drafts, the schedule's held-out
prompts): a warm-up prompt, then a 64-token generation under the stage timer
(vllm_liliprop/vllm/offline.py: StageTimes), then with --ops a 48-token one under the torch
profiler, grouped by input shape. `k` pins the system's k at batch 1 (0: plain steps).
"""

from __future__ import annotations

import argparse

from torch.profiler import ProfilerActivity, profile

from eval.schedule import HELDOUT, heldout_prompts, pinned, renderer, sampling
from eval.systems import load_systems

TARGET = ".cache/targets/smollm2-135m-instruct"
FLAGS = {"dtype": "float32", "max_model_len": 2048, "enforce_eager": True}


def engine(name: str, k: int):
    from vllm_liliprop.vllm.offline import OfflineEngine

    if name == "AR":
        return OfflineEngine(TARGET, FLAGS, None, None, max_num_seqs=1)
    catalog = load_systems("testbed/smollm2/systems.json", {"drafts": "testbed/smollm2/round3/drafts"})
    system, _ = catalog.get(name)
    return OfflineEngine(TARGET, FLAGS, pinned(system.speculative_config, k, 1), system.options(), max_num_seqs=1)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("system")
    parser.add_argument("k", type=int)
    parser.add_argument("--ops", action="store_true", help="also profile op by op")
    args = parser.parse_args(argv)
    render, prompts = renderer(TARGET), heldout_prompts(HELDOUT, 3)
    with engine(args.system, args.k) as eng:
        eng.run_batch(prompts[:1], render, sampling(0.0, 16))
        with eng.stage_timer() as times:
            result = eng.run_batch(prompts[1:2], render, sampling(0.0, 64))
        stages = {s: round(v, 2) for s, v in times.per_step_ms().items()}
        print(f"{args.system} k={args.k}: {result.num_steps} steps, ms per step {stages}")
        if args.ops:
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                eng.run_batch(prompts[2:3], render, sampling(0.0, 48))
            print(prof.key_averages(group_by_input_shape=True).table(
                sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=30, max_shapes_column_width=60))


if __name__ == "__main__":
    main()
