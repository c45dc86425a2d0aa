# Sourced by the tools that choose a setting on held-out conversations (never on the benchmarks):
# with $out set, writes the user turns of testbed/smollm2/data/heldout_regenerated.jsonl.gz as the
# testbed suite under $out/data (benchmark "testbed-heldout") and sets $target (the real target's
# folder) and $dtype (this host's serving dtype, LILIPROP_DTYPE overrides).
source scripts/env.sh
mkdir -p "$out/data/testbed"
zcat testbed/smollm2/data/heldout_regenerated.jsonl.gz > "$out/heldout.jsonl"
.venv/bin/python -m tools.heldout_suite --input "$out/heldout.jsonl" --output "$out/data/testbed/heldout.jsonl"
target=$(.venv/bin/python -m eval fetch-target smollm2-135m-instruct)
dtype=${LILIPROP_DTYPE:-$(.venv/bin/python -m vllm_liliprop.host)}
