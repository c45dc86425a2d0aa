#!/usr/bin/env bash
# The drafter's block layout at serving time, chosen on held-out conversations (never on the
# benchmarks). vLLM's DFlash path queries [anchor, mask x k]: at k = 3 a drafter trained on blocks
# of 8 sees a block of 4, which it was never trained on (teacher-forced, its first-slot acceptance
# drops from 0.56 to 0.50: docs/serving.md). Served at k = 7 with liliprop.rule_draft_length = 3
# it queries the trained block and vLLM still verifies 3 tokens. Each variant runs beside its
# system as shipped and plain decoding on the user turns of
# testbed/smollm2/data/heldout_regenerated.jsonl.gz (T = 0, c = 1, 48 tokens, side by side, paired).
# Usage: bash tools/block_layout_choice.sh [OUT_DIR] [extra eval args]
# LILIPROP_LAYOUTS: space-separated SYSTEM:k:rule_draft_length variants of testbed/smollm2/systems.json
# systems (default below; a plain DFlash draft gets the argmax rule, every other its own).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/block_layout_choice}; shift || true
source tools/heldout_setup.sh
grid=()
names=AR
for setting in ${LILIPROP_LAYOUTS:-DFlash:7:3 LiLiCorr-greedy:7:3}; do
    IFS=: read -r system k cut <<< "$setting"
    variant="$system-k$k-cut$cut"
    names="$names,$system,$variant"
    grid+=(--system "$variant=$(.venv/bin/python - "$system" "$k" "$cut" <<'PY'
import json, sys
name, k, cut = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
system = json.load(open("testbed/smollm2/systems.json"))[name]
system.pop("description", None)
system["speculative_config"]["num_speculative_tokens"] = k
system["liliprop"] = {**system.get("liliprop", {}), "rule_draft_length": cut}
print(json.dumps(system))
PY
)")
done
run_heldout "$names" 16 --paired --side-by-side "$@"
