#!/usr/bin/env bash
# Issue 34: DFlash at T = 1 with and without option sampled_k = 0 (sampled requests draft
# nothing), each run paired with plain decoding: c = 1 prompt by prompt, side by side; c = 4 and
# 16 one batch per benchmark and seed. Hold the host idle. OUT=DIR overrides the results folder.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source scripts/env.sh
export PYTHONPATH=$PWD
dtype=$(.venv/bin/python -m vllm_liliprop.host 2>/dev/null)
out=${OUT:-testbed/smollm2/schedule/sampled_results}
common=(--target .cache/targets/smollm2-135m-instruct --systems testbed/smollm2/schedule/sampled_k_systems.json
        --var drafts=$PWD/testbed/smollm2/round3/drafts --data-dir .cache/benchmarks
        --benchmarks mtbench,gsm8k,humaneval --temperatures 1 --max-tokens 48 --warmup-tokens 8 --paired
        --engine-flags '{"dtype": "'$dtype'", "max_model_len": 2048, "enforce_eager": true}'
        --results "$out/results.csv" --no-summary)
VLLM_CPU_KVCACHE_SPACE=1 .venv/bin/python -m eval run "${common[@]}" --concurrency 1 --limit 8 --seeds 42 --side-by-side
.venv/bin/python -m eval run "${common[@]}" --concurrency 4,16 --limit 16 --seeds 42,43
.venv/bin/python -m eval summarize "$out/results.csv" > "$out/summary.md"
cat "$out/summary.md"
