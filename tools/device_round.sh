#!/usr/bin/env bash
# A DFlash round on a lent GPU (issue 32): no network and no vLLM there, and a call carries at
# most 64 MiB, so the target travels as its pinned GGUF in three parts (.devA/.devB/.devC, one
# per call while the machine stays warm) with the shipped drafter's weights (LM head left out:
# it is the target's) and the benchmark prompts; this script rebuilds the target exactly as
# `python -m eval fetch-target` does and runs `python -m training.device_round` within the
# seconds left of the call. Usage (the last call): bash tools/device_round.sh SECONDS
set -euo pipefail
began=$(date +%s)
budget=${1:-570}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/gguf-*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
target=.cache/targets/smollm2-135m-instruct
if [ ! -f $target/model.safetensors ]; then
    cat .cache/parts/A/gguf.part .cache/parts/B/gguf.part .devC/gguf.part > /tmp/target.gguf
    echo "$(cat .cache/parts/A/gguf.sha256)  /tmp/target.gguf" | sha256sum -c -
    python3 -c "
from pathlib import Path; import shutil
from eval.targets import convert_gguf
shutil.rmtree('$target', ignore_errors=True)
convert_gguf(Path('/tmp/target.gguf'), Path('$target'), 'bfloat16')"
    sha256sum $target/model.safetensors
fi
left=$(( budget - ($(date +%s) - began) ))
echo "[device_round.sh] target ready after $(( $(date +%s) - began )) s; $left s left for the round"
export TQDM_DISABLE=1
rc=0
python3 -m training.device_round --target $target --snapshot testbed/smollm2/data \
    --eval-dir .cache/parts/A/benchmarks --init-draft .cache/parts/B/dflash --out .cache/device_round \
    --budget-s "$left" --pack "$OUT" > "$OUT/log" 2>&1 || rc=$?
grep -v -i "warn" "$OUT/log" | tail -60
exit $rc
