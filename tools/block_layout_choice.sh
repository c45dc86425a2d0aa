#!/usr/bin/env bash
# The drafter's block layout at serving time, chosen on held-out conversations (never on the
# benchmarks). vLLM's DFlash path queries [anchor, mask x k]: at k = 3 a drafter trained on blocks
# of 8 sees a block of 4, which it was never trained on (teacher-forced, its first-slot acceptance
# drops from 0.56 to 0.50: docs/serving.md). Served at k = 7 with liliprop.rule_draft_length = 3
# it queries the trained block and vLLM still verifies 3 tokens. Each setting runs beside plain
# decoding on the user turns of testbed/smollm2/data/heldout_regenerated.jsonl.gz (T = 0, c = 1,
# 48 tokens, side by side, paired).
# Usage: bash tools/block_layout_choice.sh [OUT_DIR] [extra eval args]
# LILIPROP_LAYOUTS: space-separated draft:rule:k:rule_draft_length settings (default below).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/block_layout_choice}; shift || true
source tools/heldout_setup.sh
drafts="$(pwd)/testbed/smollm2/round3/drafts"
grid=()
names=AR,DFlash,LiLiCorr-greedy
for setting in ${LILIPROP_LAYOUTS:-dflash:argmax:7:3 dflash:argmax:7:4 lilicorr:lattice:7:3}; do
    IFS=: read -r draft rule k cut <<< "$setting"
    name="$draft-$rule-k$k-cut$cut"
    names="$names,$name"
    grid+=(--system "$name={\"speculative_config\": {\"method\": \"dflash\", \"model\": \"$drafts/$draft\", \"num_speculative_tokens\": $k}, \"liliprop\": {\"rule\": \"$rule\", \"rule_draft_length\": $cut}}")
done
run_heldout "$names" 16 --paired --side-by-side "$@"
