#!/usr/bin/env bash
# Set everything up, then check the whole project:
#   1. the wheel: built from this checkout, installed (not editable) into a fresh virtualenv
#      outside it, used from outside it (scripts/check-wheel.sh);
#   2. lint and types: ruff, mypy on the checkout (scripts/lint.sh);
#   3. the test suite: unit tests (the dependency rules among them) and end-to-end tests against
#      a real Slurm testbed (its own, at /tmp/ctb-test, torn down at the end), one of which runs
#      a job from the wheel's virtualenv; one pytest session per Slurm release:
#        a. unit tests (two processes), again with the wall clock a year ahead (`--clock-shift=+365d`,
#           tests/clock_shift.py: a test that depends on today's date fails the day it is written),
#           and the whole end-to-end suite on this machine's Slurm 22.05;
#        b. the stories marked `slurm_versions` (those whose Slurm side differs between releases) on the
#           newest release (26.05, Debian sid's root filesystem) and on 24.11 (Debian trixie's); every
#           other story on the newest release too: scripts/test-matrix.sh (kept out for CI's 45 minutes);
#        c. the main-job story on the docker-compose testbed (26.05; about 1.5 min);
#        d. the stories marked `production` on a testbed with Slurm's default timeouts (300/10/30 s:
#           a real cluster's), 22.05 (scripts/test-production.sh: those and the batch host's).
#      Stories marked `matrix_only` (kept out for CI's 45 minutes) run in none of these.
#      A root filesystem missing from /var/cache/clusterctl-testbed is built first (about a minute).
#      Every release, in full: scripts/test-matrix.sh.
# Arguments go to one pytest session instead of a-d (`bash scripts/test.sh tests/unit -q`; its
# release from CLUSTERCTL_TEST_SLURM, default 22.05); steps 1 and 2 always run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# With PyTorch's CPU build (about 45 s): tests/unit/test_torch_trainer.py and
# tests/e2e/test_pytorch.py run in the 22.05 session (about 5 min together) instead of skipping.
# With Debian's Chromium: tests/unit/test_report_in_a_browser.py renders `report --html` (about 5 s).
CLUSTERCTL_TORCH=1 CLUSTERCTL_BROWSER=1 bash scripts/setup.sh

wheel_dir=$(mktemp -d /tmp/clusterctl-wheel.XXXXXX)
trap 'rm -rf "$wheel_dir"' EXIT
failed=()
if bash scripts/check-wheel.sh "$wheel_dir/venv" >/dev/null; then
  export CLUSTERCTL_WHEEL_VENV=$wheel_dir/venv
else
  failed+=("the wheel (scripts/check-wheel.sh)")
fi
bash scripts/lint.sh || failed+=("lint (scripts/lint.sh)")

NEWEST=26.05
status=0
summary=()
# One pytest session on one Slurm release (CLUSTERCTL_TEST_SLURM); "collected nothing" is a failure.
session() {
  local release=$1 started=$SECONDS rc=0
  shift
  echo "test: Slurm $release: pytest $*" >&2
  # --durations: the slowest stories, for whoever next has to keep CI within its 45 minutes.
  CLUSTERCTL_TEST_SLURM=$release .venv/bin/python -m pytest --durations=12 "$@" || rc=$?
  [[ $rc -ne 5 ]] || { echo "test: pytest collected no tests; that is a failure" >&2; rc=1; }
  summary+=("Slurm $release: pytest $* -> exit $rc in $((SECONDS - started)) s")
  [[ $rc -eq 0 ]] || status=1
}
if [[ $# -gt 0 ]]; then
  session "${CLUSTERCTL_TEST_SLURM:-host}" "$@"
else
  # The unit tests on both cores (pytest-xdist), then the end-to-end suite (one testbed, serial).
  session host tests/unit -n 2
  session host tests/unit -n 2 --clock-shift=+365d
  session host tests/e2e -m "not matrix_only"
  session "$NEWEST" tests/e2e -m "slurm_versions and not matrix_only"
  session 24.11 tests/e2e -m "slurm_versions and not matrix_only"
  # d. the node-death story again under Slurm's default timeouts (its own testbed; about 2 min);
  #    the batch host's, which waits for Slurm's 300 s verdict, in scripts/test-production.sh.
  CLUSTERCTL_TEST_TIMEOUTS=production session host tests/e2e -m production
  # c. the main-job story through the docker-compose testbed, on the newest release.
  CLUSTERCTL_TEST_BACKEND=compose session "$NEWEST" tests/e2e/test_supervisor.py -k "xid_79_mid_run"
fi
printf 'test: %s\n' "${summary[@]}" >&2
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "test: failed before the test suite: ${failed[*]} (see above)" >&2
  exit 1
fi
exit "$status"
