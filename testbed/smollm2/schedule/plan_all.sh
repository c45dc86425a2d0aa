#!/usr/bin/env bash
# Issue 34: plan every shipped system's speculation schedule on this host: steady-state step
# costs, calibrated by served batches of held-out prompts at 4, 16 and 32 slots, served as eval
# serves those concurrencies (eval/schedule.py: 16 prompts through 4 slots, refilled; 16 and 32
# started full and drained), sampled requests never drafting. Writes systems.json and
# systems.measurements.json (every measurement). Hold the host idle (about 70 minutes on 2 cores).
# ONLY=A,B overrides the systems; SERVED=B,B the served batch sizes (default 4,16,32). FROM=FILE plans from an earlier measurements file instead,
# measuring only the served sizes it lacks (how the 2026-12-06 11:08 plan added the refilled 4 to
# the 05:22 measurements: FROM=<testbed/smollm2/schedule/systems.measurements.json at 28d89ca>,
# e.g. `git show 28d89ca:testbed/smollm2/schedule/systems.measurements.json > /tmp/before.json`).
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
    --batch-sizes 1,4,16,32 --sampled-k0 --served-batch-sizes ${SERVED:-4,16,32} --rounds 3 \
    --engine-flags '{"max_model_len": 2048, "enforce_eager": true}' "${from[@]}" --out $here/systems.json
