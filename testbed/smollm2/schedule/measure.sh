#!/usr/bin/env bash
# Item 4: fixed k vs the measured schedule, paired against AR, T = 0, c = 1 and c = 16.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source scripts/env.sh
export PYTHONPATH=$PWD
dtype=$(.venv/bin/python -m vllm_liliprop.host 2>/dev/null)
flags='{"dtype": "'$dtype'", "max_model_len": 2048, "enforce_eager": true}'
sysfile=${SYSFILE:-testbed/smollm2/schedule/systems.json}
only=${ONLY:-AR,DFlash,DFlash-scheduled,DFlash+lookup,DFlash+lookup-scheduled}
out=${OUT:-testbed/smollm2/schedule/results}
common=(--target .cache/targets/smollm2-135m-instruct --systems "$sysfile" --var drafts=$PWD/testbed/smollm2/round3/drafts
        --data-dir .cache/benchmarks --only "$only" --temperatures 0 --max-tokens 48 --warmup-tokens 8 --paired
        --engine-flags "$flags" --no-progress)
date
.venv/bin/python -m eval run "${common[@]}" --benchmarks mtbench,gsm8k --concurrency 16 --limit 16 --results $out/c16.csv
date
.venv/bin/python -m eval run "${common[@]}" --benchmarks pypi --concurrency 1 --limit 1 --results $out/c1.csv
date
