#!/usr/bin/env bash
# The hybrid rule's draft lengths (num_speculative_tokens for the lookup, rule_draft_length for the
# drafter's block; vllm_liliprop/draft_length.py), chosen on held-out conversations (never on the
# benchmarks): the user turns of testbed/smollm2/data/heldout_regenerated.jsonl.gz as a testbed
# suite, T = 0, c = 1, 48 tokens, each prompt timed beside plain decoding (--paired), since a longer
# draft trades verify cost for tokens per step. The peers suffix (where installed) and ngram run
# beside them, so the choice also says whether the hybrid leads on data it was not chosen for.
# Usage: bash tools/draft_length_choice.sh [OUT_DIR] [extra eval args]
# LILIPROP_LENGTHS: space-separated k:rule_draft_length settings (default below).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/draft_length_choice}; shift || true
source tools/heldout_setup.sh
draft="$(pwd)/testbed/smollm2/round3/drafts/dflash"
grid=()
names=AR,DFlash+lookup,ngram
.venv/bin/python -c "import arctic_inference.suffix_decoding" 2>/dev/null && names=$names,suffix
for setting in ${LILIPROP_LENGTHS:-7:3 7:2 11:3}; do
    IFS=: read -r k cut <<< "$setting"
    name="lookup-k$k-cut$cut"
    names="$names,$name"
    grid+=(--system "$name={\"speculative_config\": {\"method\": \"dflash\", \"model\": \"$draft\", \"num_speculative_tokens\": $k}, \"liliprop\": {\"rule\": \"argmax\", \"prompt_lookup\": [2, 4], \"rule_draft_length\": $cut}}")
done
run_heldout "$names" 16 --paired "$@"
