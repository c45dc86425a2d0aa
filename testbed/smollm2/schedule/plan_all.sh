#!/usr/bin/env bash
# Issue 34: plan every shipped system's speculation schedule on this host, the steady-state
# step costs calibrated by served batches of held-out prompts (eval/schedule.py), sampled
# requests never drafting. Writes testbed/smollm2/schedule/systems.json and its measurements.
# Hold the host idle (about 50 minutes on 2 cores). OUT=FILE, ONLY=A,B override the defaults.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source scripts/env.sh
export PYTHONPATH=$PWD
only=${ONLY:-DFlash,DFlash+lookup,LiLiCorr-greedy,LiLiCorr-viterbi,LiLiCorr+DeLS,LiLiCorr+lookup,DeLS-GRU,DeLS-Markov,Domino,DSpark}
# Eleven engines open at once: 1 GiB of KV cache each holds a batch of 32 short requests many times over.
VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE_EACH:-1} .venv/bin/python -m eval schedule \
    --target .cache/targets/smollm2-135m-instruct --systems testbed/smollm2/systems.json \
    --var drafts=$PWD/testbed/smollm2/round3/drafts --only "$only" \
    --batch-sizes 1,4,16,32 --served-batch-sizes 4,16,32 --rounds 3 --sampled-k0 \
    --engine-flags '{"max_model_len": 2048, "enforce_eager": true}' \
    --out "${OUT:-testbed/smollm2/schedule/systems.json}"
