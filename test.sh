#!/usr/bin/env bash
# The test suite: set up (first time only), then pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
source scripts/env.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
rc=0
.venv/bin/python -m pytest -p no:cacheprovider "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: treating that as a failure" >&2
    exit 1
fi
exit "$rc"
