#!/usr/bin/env bash
# The recovery stories under Slurm's default timeouts (SlurmdTimeout=300, MessageTimeout=10, KillWait=30),
# as a real cluster runs them, on this machine's Slurm (22.05) unless CLUSTERCTL_TEST_SLURM says otherwise:
#   bash scripts/test-production.sh               the stories marked `production` (every submission's CI
#                                                 runs these too) and `production_matrix` (the batch host
#                                                 powered off: it waits for Slurm to declare the node DOWN,
#                                                 5-7 minutes by design; see docs/architecture.md, "The batch host")
#   bash scripts/test-production.sh -- -x -k cut  arguments after -- go to pytest
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ ${1:-} == -- ]] && shift
CLUSTERCTL_TEST_TIMEOUTS=production CLUSTERCTL_TEST_SLURM=${CLUSTERCTL_TEST_SLURM:-host} \
  exec .venv/bin/python -m pytest tests/e2e -p no:cacheprovider -m "production or production_matrix" "$@"
