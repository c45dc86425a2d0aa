#!/usr/bin/env bash
# The n-gram peer's k and lookup lengths, chosen on held-out conversations (never on the
# benchmarks): the user turns of testbed/smollm2/data/heldout_regenerated.jsonl.gz (Magpie
# prompts held out of every draft's training) as a testbed suite, a small grid of vLLM's
# prompt-lookup settings, paired speedups at T = 0, c = 1 in the main job's timing setup.
# Usage: bash tools/ngram_choice.sh [OUT_DIR] [extra eval args]; hold the measure lock.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/ngram_choice}; shift || true
source tools/heldout_setup.sh
grid=()
names=AR
for setting in 3:1:3 2:2:4 3:2:4 5:2:4 3:3:5 5:3:5; do
    IFS=: read -r k lo hi <<< "$setting"
    name="ngram-k$k-n$lo-$hi"
    names="$names,$name"
    grid+=(--system "$name={\"speculative_config\": {\"method\": \"ngram\", \"num_speculative_tokens\": $k, \"prompt_lookup_min\": $lo, \"prompt_lookup_max\": $hi}}")
done
run_heldout "$names" 12 --paired "$@"
