#!/usr/bin/env bash
# Issue 36's sweep beyond the main job: this package's systems beside the peers at c = 16 and
# T = 0 and 1 (16 prompts a benchmark: one full batch), each batch paired with plain decoding on
# the same prompts. Hold the host idle.
# Usage: bash tools/peers_sweep.sh [OUT_DIR] [extra eval args, e.g. --only AR,DFlash]; later flags
# win, so `--concurrency 1 --temperatures 1 --seeds 42 --limit 5` gives the c = 1, T = 1 run.
# LILIPROP_TESTBED=smollm2 (default: SmolLM2-135M-Instruct, the seven benchmarks, the main job's
# dtype) or tiny (testbed/tiny: its 1.3M-parameter target and its three held-out suites, fp32).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
out=${1:-results/peers_sweep}; shift || true
mkdir -p "$out"
case "${LILIPROP_TESTBED:-smollm2}" in
    smollm2)
        target=$(.venv/bin/python -m eval fetch-target smollm2-135m-instruct)
        dtype=${LILIPROP_DTYPE:-$(.venv/bin/python -m vllm_liliprop.host)} max_len=2048
        bed=(--systems testbed/smollm2/systems.json --var "drafts=$(pwd)/testbed/smollm2/round3/drafts"
             --benchmarks pypi --data-dir "${LILIPROP_CACHE:-.cache}/benchmarks") ;;
    tiny)
        target=testbed/tiny/target dtype=float32 max_len=1024
        bed=(--systems testbed/tiny/systems.json --var "testbed=$(pwd)/testbed/tiny"
             --benchmarks testbed --data-dir testbed/tiny/eval) ;;
    *) echo "LILIPROP_TESTBED must be smollm2 or tiny" >&2; exit 2 ;;
esac
.venv/bin/python -m eval run --target "$target" "${bed[@]}" --only AR,DFlash,DFlash+lookup,ngram \
    --limit 16 --concurrency 16 --temperatures 0,1 --max-tokens 48 --warmup-tokens 8 --paired \
    --engine-flags '{"dtype": "'"$dtype"'", "max_model_len": '"$max_len"', "enforce_eager": true}' \
    --results "$out/results.csv" --no-summary "$@"
.venv/bin/python -m eval summarize "$out/results.csv"
