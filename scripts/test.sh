#!/usr/bin/env bash
# Set everything up, then run the whole test suite: unit tests and end-to-end tests
# against a real Slurm testbed (its own, at /tmp/ctb-test, torn down at the end).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
status=0
.venv/bin/python -m pytest "$@" || status=$?
if [[ $status -eq 5 ]]; then
  echo "test: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$status"
