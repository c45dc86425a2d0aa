#!/usr/bin/env bash
# The main job: set up (first time only), then evaluate every system on the built-in tiny
# testbed through real vLLM engines, print the tables and write the plots.
# Extra arguments go to `python -m eval run` (e.g. --limit 4, --temperatures 0,1).
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
source scripts/env.sh
out=${LILIPROP_OUT:-results/testbed}
testbed="$(pwd)/testbed/tiny"
.venv/bin/python -m eval run \
    --target "$testbed/target" --systems "$testbed/systems.json" --var "testbed=$testbed" \
    --benchmarks testbed --data-dir "$testbed/eval" \
    --temperatures 0 --concurrency 4 --limit 12 --max-tokens 64 \
    --engine-flags '{"dtype": "float32", "max_model_len": 1024, "enforce_eager": true}' \
    --results "$out/results.csv" "$@"
.venv/bin/python -m plots all --results "$out/results.csv" --out "$out/plots"
echo "results table: $out/results.csv"
echo "plots and tables: $out/plots/index.md"
