#!/usr/bin/env bash
# Optional: suffix decoding (speculative method "suffix") for the peer system "suffix". vLLM 0.32
# serves it through arctic-inference, on PyPI only as an sdist (0.3.0) with a C++ suffix tree.
# A plain `pip install arctic-inference==0.3.0` builds it in an isolated environment that pulls
# a CUDA torch (its build requires torch>=2.10) and lets CMake find the system Python instead
# of the build's (so it misses nanobind). Here: the build tools in a throwaway venv that sees
# .venv's torch, the wheel built without isolation for .venv's Python, installed with --no-deps
# (it has no required dependencies; its vLLM plugin stays off unless ARCTIC_INFERENCE_ENABLED=1).
# Needs a C++20 compiler (g++ 10+). Checks that vLLM still imports afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
py="$(cd "$VENV" && pwd)/bin/python"
if "$py" -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
    echo "[suffix] arctic-inference already installed"; exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
base=$("$py" -c "import sys; print(sys.base_prefix)")/bin/python3
"$base" -m venv "$work/build"
# addsitedir, not a path line: .venv's own .pth files (editable installs) are read as well.
"$py" -c "import site; print(f'import site; site.addsitedir({site.getsitepackages()[0]!r})')" \
    > "$work/build/lib/python3.11/site-packages/venv_torch.pth"
"$work/build/bin/python" -m pip install -q "nanobind==2.9.2" "cmake>=3.18" ninja setuptools wheel grpcio-tools
# PyPI has only the sdist; reading its metadata with the build tools above (and .venv's torch)
# keeps pip from fetching a CUDA torch into an isolated build environment just to do that.
"$work/build/bin/python" -m pip download -q --no-deps --no-build-isolation "arctic-inference==0.3.0" -d "$work"
tar xzf "$work"/arctic_inference-0.3.0.tar.gz -C "$work"
(cd "$work/arctic_inference-0.3.0" && PATH="$work/build/bin:$PATH" \
    CMAKE_ARGS="-DPython_EXECUTABLE=$work/build/bin/python" \
    "$work/build/bin/python" -m pip wheel -q --no-build-isolation --no-deps -w "$work/wheels" .)
"$py" -m pip install -q --no-deps "$work"/wheels/arctic_inference-0.3.0-*.whl
"$py" -c "from vllm import LLM; import arctic_inference.suffix_decoding" >/dev/null
echo "[suffix] arctic-inference 0.3.0 built and installed into $VENV"
