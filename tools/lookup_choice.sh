#!/usr/bin/env bash
# The hybrid rule's lookup lengths (option prompt_lookup), chosen on held-out conversations (never
# on the benchmarks): the user turns of testbed/smollm2/data/heldout_regenerated.jsonl.gz as a
# testbed suite, DFlash + prompt lookup at a few [min_n, max_n], T = 0, c = 1, 48 tokens. The
# lookup itself costs next to nothing, so the choice is the fewest verification steps (highest
# tokens per step); no timing, so a busy host does not bias it.
# Usage: bash tools/lookup_choice.sh [OUT_DIR] [extra eval args]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/lookup_choice}; shift || true
source tools/heldout_setup.sh
draft="$(pwd)/testbed/smollm2/round3/drafts/dflash"
grid=()
names=DFlash
for setting in 1:3 2:4 3:5 4:8; do
    IFS=: read -r lo hi <<< "$setting"
    name="lookup-n$lo-$hi"
    names="$names,$name"
    grid+=(--system "$name={\"speculative_config\": {\"method\": \"dflash\", \"model\": \"$draft\", \"num_speculative_tokens\": 3}, \"liliprop\": {\"rule\": \"argmax\", \"prompt_lookup\": [$lo, $hi]}}")
done
run_heldout "$names" 12 "$@"
.venv/bin/python -c "
import pandas as pd, sys
d = pd.read_csv(sys.argv[1])[['system', 'num_drafts', 'num_accepted_tokens', 'output_tokens']]
d['tokens_per_step'] = (d.output_tokens / d.num_drafts).round(3)
print(d.to_string(index=False))" "$out/results.csv"
