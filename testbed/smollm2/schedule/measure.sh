#!/usr/bin/env bash
# Issue 34: fixed k against the measured schedule (systems.json, written by `python -m eval schedule`),
# each batch paired with plain decoding on the same prompts, beside vLLM's n-gram proposer (the peer
# a user would pick): c = 16 and c = 4 at T = 0 and T = 1 (seed 42). Hold the host idle.
# OUT=DIR, CONCURRENCY="16 4", TEMPERATURES=0,1, BENCHMARKS=mtbench,gsm8k,humaneval, SYSFILE, ONLY
# override the defaults.
# Each benchmark gives max(16, c) prompts, so that c = 32 fills its batch (LIMIT=n: n instead).
set -euo pipefail
cd "$(dirname "$0")/../../.."
source scripts/env.sh
export PYTHONPATH=$PWD
dtype=$(.venv/bin/python -m vllm_liliprop.host 2>/dev/null)
flags='{"dtype": "'$dtype'", "max_model_len": 2048, "enforce_eager": true}'
sysfile=${SYSFILE:-testbed/smollm2/schedule/systems.json}
only=${ONLY:-AR,DFlash,DFlash-scheduled,DFlash+lookup,DFlash+lookup-scheduled,ngram}
out=${OUT:-testbed/smollm2/schedule/results}
ngram=$(.venv/bin/python -c "import json; print(json.dumps(json.load(open('testbed/smollm2/systems.json'))['ngram']))")
common=(--target .cache/targets/smollm2-135m-instruct --systems "$sysfile" --system "ngram=$ngram"
        --var drafts=$PWD/testbed/smollm2/round3/drafts --data-dir .cache/benchmarks --only "$only"
        --temperatures "${TEMPERATURES:-0,1}" --seeds 42 --max-tokens 48 --warmup-tokens 8 --paired --engine-flags "$flags")
for c in ${CONCURRENCY:-16 4}; do
    date
    .venv/bin/python -m eval run "${common[@]}" --benchmarks "${BENCHMARKS:-mtbench,gsm8k,humaneval}" \
        --concurrency "$c" --limit "${LIMIT:-$(( c > 16 ? c : 16 ))}" --results "$out/results.csv" --no-summary
done
date
.venv/bin/python -m eval summarize "$out/results.csv" > "$out/summary.md"
cat "$out/summary.md"
