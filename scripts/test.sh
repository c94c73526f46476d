#!/usr/bin/env bash
# Set everything up, then check the whole project:
#   1. the wheel: built from this checkout, installed (not editable) into a fresh virtualenv
#      outside it, used from outside it (scripts/check-wheel.sh);
#   2. lint and types: ruff, mypy on the core (scripts/lint.sh);
#   3. the test suite: unit tests (the dependency rules among them) and end-to-end tests against
#      a real Slurm testbed (its own, at /tmp/ctb-test, torn down at the end), one of which runs
#      a job from the wheel's virtualenv.
# Arguments go to pytest (`bash scripts/test.sh tests/unit -q`); steps 1 and 2 always run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh

wheel_dir=$(mktemp -d /tmp/clusterctl-wheel.XXXXXX)
trap 'rm -rf "$wheel_dir"' EXIT
failed=()
if bash scripts/check-wheel.sh "$wheel_dir/venv" >/dev/null; then
  export CLUSTERCTL_WHEEL_VENV=$wheel_dir/venv
  bash scripts/lint.sh "$wheel_dir/venv" || failed+=("lint (scripts/lint.sh)")
else
  failed+=("the wheel (scripts/check-wheel.sh)")
  bash scripts/lint.sh || failed+=("lint (scripts/lint.sh)")
fi

status=0
.venv/bin/python -m pytest "$@" || status=$?
if [[ $status -eq 5 ]]; then
  echo "test: pytest collected no tests; that is a failure" >&2
  exit 1
fi
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "test: failed before the test suite: ${failed[*]} (see above)" >&2
  exit 1
fi
exit "$status"
