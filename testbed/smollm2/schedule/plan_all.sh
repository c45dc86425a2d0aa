#!/usr/bin/env bash
# Issue 34: plan every shipped system's speculation schedule on this host: steady-state step
# costs, calibrated by served batches of held-out prompts at 1, 4, 16 and 32 slots, served as eval
# serves those concurrencies (eval/schedule.py: 16 prompts through 1 slot, one after another, and
# through 4 slots, refilled; 16 and 32 started full and drained), sampled requests never drafting.
# Writes systems.json and systems.measurements.json (every measurement). Hold the host idle
# (about 105 minutes on 2 cores; the served batch of 1 alone takes 45).
# ONLY=A,B overrides the systems; SERVED=B,B the served batch sizes (default 1,4,16,32, as the
# shipped plans; before 2026-12-06 23:19 they were 4,16,32). FROM=FILE plans from an earlier
# measurements file instead, measuring only the served sizes it lacks. The shipped plans:
# `git show f2151f7:testbed/smollm2/schedule/systems.measurements.json > /tmp/before.json`, then
# FROM=/tmp/before.json (the 20:35 costs and the 4, 16, 32 served batches), which measured only
# the served batch of 1. OUT=FILE writes another host's plans elsewhere (default systems.json
# here; the AVX2 host's: avx2/systems.json). ROUNDS=n: interleaved rounds (default 3).
set -euo pipefail
cd "$(dirname "$0")/../../.."
source scripts/env.sh
export PYTHONPATH=$PWD
here=testbed/smollm2/schedule
only=${ONLY:-DFlash,DFlash+lookup,LiLiCorr-greedy,LiLiCorr-viterbi,LiLiCorr+DeLS,LiLiCorr+lookup,DeLS-GRU,DeLS-Markov,Domino,DSpark}
from=()
if [ -n "${FROM:-}" ]; then
    cp "$FROM" .cache/plan_from.measurements.json  # --out rewrites the file it names
    from=(--from-measurements .cache/plan_from.measurements.json)
fi
# Eleven engines open at once: 1 GiB of KV cache each holds a batch of 32 short requests many times over.
VLLM_CPU_KVCACHE_SPACE=1 .venv/bin/python -m eval schedule --target .cache/targets/smollm2-135m-instruct \
    --systems testbed/smollm2/systems.json --var drafts=$PWD/testbed/smollm2/round3/drafts --only "$only" \
    --batch-sizes 1,4,16,32 --sampled-k0 --served-batch-sizes ${SERVED:-1,4,16,32} --rounds ${ROUNDS:-3} \
    --engine-flags '{"max_model_len": 2048, "enforce_eager": true}' "${from[@]}" --out ${OUT:-$here/systems.json}
