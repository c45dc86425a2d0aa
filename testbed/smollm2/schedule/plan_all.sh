#!/usr/bin/env bash
# Issue 34: plan every shipped system's speculation schedule on this host: steady-state step
# costs, calibrated by served batches of held-out prompts at 16 and 32 (eval/schedule.py),
# sampled requests never drafting. Served batches of 4 are measured too, for the record only:
# a drained batch of 4 is not how eval (16 prompts at c = 4) or a loaded server runs c = 4.
# Writes served_4_16_32.measurements.json (every measurement), then systems.json and
# systems.measurements.json planned from it. Hold the host idle (about 55 minutes on 2 cores).
# ONLY=A,B overrides the systems.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source scripts/env.sh
export PYTHONPATH=$PWD
here=testbed/smollm2/schedule
only=${ONLY:-DFlash,DFlash+lookup,LiLiCorr-greedy,LiLiCorr-viterbi,LiLiCorr+DeLS,LiLiCorr+lookup,DeLS-GRU,DeLS-Markov,Domino,DSpark}
common=(--target .cache/targets/smollm2-135m-instruct --systems testbed/smollm2/systems.json
        --var drafts=$PWD/testbed/smollm2/round3/drafts --only "$only" --batch-sizes 1,4,16,32 --sampled-k0)
# Eleven engines open at once: 1 GiB of KV cache each holds a batch of 32 short requests many times over.
VLLM_CPU_KVCACHE_SPACE=1 .venv/bin/python -m eval schedule "${common[@]}" \
    --served-batch-sizes 4,16,32 --rounds 3 \
    --engine-flags '{"max_model_len": 2048, "enforce_eager": true}' --out .cache/schedule_all/systems.json
cp .cache/schedule_all/systems.measurements.json $here/served_4_16_32.measurements.json
.venv/bin/python -m eval schedule "${common[@]}" --served-batch-sizes 16,32 \
    --from-measurements $here/served_4_16_32.measurements.json --out $here/systems.json
