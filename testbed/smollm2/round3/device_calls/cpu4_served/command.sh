#!/usr/bin/env bash
# The CPU-4 drafter served beside the shipped one on held-out prompts (T = 0, c = 1, 48 tokens,
# side by side with plain decoding), both at k = 7 with 3 verified.
set -euo pipefail
cd "$(dirname "$0")/../../../../.."
out=.cache/cpu4_served
source tools/heldout_setup.sh
system=$(.venv/bin/python - <<'PY'
import json
s = json.load(open("testbed/smollm2/systems.json"))["DFlash"]
s.pop("description", None)
s["speculative_config"]["model"] = str(__import__("pathlib").Path(".cache/cpu_round4/dflash").resolve())
print(json.dumps(s))
PY
)
grid=(--system "DFlash-cpu4=$system")
VLLM_CPU_KVCACHE_SPACE=1 run_heldout AR,DFlash,DFlash-cpu4 24 --paired --side-by-side
.venv/bin/python -m eval summarize "$out/results.csv" > "$out/summary.md"
