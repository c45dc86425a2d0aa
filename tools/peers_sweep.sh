#!/usr/bin/env bash
# Issue 36's sweep beyond the main job: this package's systems beside the n-gram peer at c = 16 and
# T = 0 and 1, on the seven benchmarks (16 prompts each: one full batch), each batch paired with
# plain decoding on the same prompts, in the main job's dtype and settings. Hold the host idle.
# Usage: bash tools/peers_sweep.sh [OUT_DIR] [extra eval args, e.g. --only AR,DFlash]; later flags win,
# so `--concurrency 1 --temperatures 1 --seeds 42 --limit 5` gives the c = 1, T = 1 run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
out=${1:-results/peers_sweep}; shift || true
mkdir -p "$out"
target=$(.venv/bin/python -m eval fetch-target smollm2-135m-instruct)
dtype=${LILIPROP_DTYPE:-$(.venv/bin/python -m vllm_liliprop.host)}
.venv/bin/python -m eval run --target "$target" --systems testbed/smollm2/systems.json \
    --var "drafts=$(pwd)/testbed/smollm2/round3/drafts" --only AR,DFlash,DFlash+lookup,ngram \
    --benchmarks pypi --data-dir "${LILIPROP_CACHE:-.cache}/benchmarks" --limit 16 --concurrency 16 \
    --temperatures 0,1 --max-tokens 48 --warmup-tokens 8 --paired \
    --engine-flags '{"dtype": "'"$dtype"'", "max_model_len": 2048, "enforce_eager": true}' \
    --results "$out/results.csv" --no-summary "$@"
.venv/bin/python -m eval summarize "$out/results.csv"
