#!/usr/bin/env bash
# The main job: set up (first time only), then evaluate the systems on the built-in testbed.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
source scripts/env.sh
exec .venv/bin/python -m vllm_liliprop.vllm.demo "$@"
