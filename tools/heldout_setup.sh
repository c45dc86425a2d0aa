# Sourced by the tools that choose a setting on held-out conversations (never on the benchmarks):
# with $out set, writes the user turns of testbed/smollm2/data/heldout_regenerated.jsonl.gz as the
# testbed suite under $out/data (benchmark "testbed-heldout") and sets $target (the real target's
# folder) and $dtype (this host's serving dtype, LILIPROP_DTYPE overrides); defines run_heldout.
source scripts/env.sh
mkdir -p "$out/data/testbed"
zcat testbed/smollm2/data/heldout_regenerated.jsonl.gz > "$out/heldout.jsonl"
.venv/bin/python -m tools.heldout_suite --input "$out/heldout.jsonl" --output "$out/data/testbed/heldout.jsonl"
target=$(.venv/bin/python -m eval fetch-target smollm2-135m-instruct)
dtype=${LILIPROP_DTYPE:-$(.venv/bin/python -m vllm_liliprop.host)}

# run_heldout NAMES LIMIT [eval args...]: the systems NAMES (from testbed/smollm2/systems.json and
# the --system entries in $grid) on the first LIMIT held-out prompts, T = 0, c = 1, 48 tokens, in
# this host's dtype, into $out/results.csv.
run_heldout() {
    .venv/bin/python -m eval run --target "$target" --systems testbed/smollm2/systems.json "${grid[@]}" \
        --var "drafts=$(pwd)/testbed/smollm2/round3/drafts" --only "$1" --benchmarks testbed-heldout \
        --data-dir "$out/data" --limit "$2" --temperatures 0 --concurrency 1 --max-tokens 48 \
        --warmup-tokens 8 --engine-flags '{"dtype": "'"$dtype"'", "max_model_len": 2048, "enforce_eager": true}' \
        --results "$out/results.csv" "${@:3}"
}
