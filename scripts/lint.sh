#!/usr/bin/env bash
# Lint and types, on the checkout itself:
#   scripts/lint.sh
# ruff over the repository, then mypy over the whole package `clusterctl` (both configured in
# pyproject.toml).  clusterctl/ holds a symlink to each part's folder (clusterctl/launcher ->
# ../launcher), so mypy reads the checkout with the layout the wheel installs; its messages name
# files as clusterctl/launcher/..., which is launcher/... in the checkout.  The core (errors,
# files, clock, progress, slurm, records) is strict; the parts get the default checks plus
# check_untyped_defs.  Then mypy over the tests' shared fakes (tests/fakes.py), which checks that each fake
# still satisfies its door's Protocol.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin=$PWD/.venv/bin

"$bin/ruff" check --quiet --no-fix .
echo "lint: ruff: clean" >&2

"$bin/mypy" --config-file pyproject.toml -p clusterctl || { echo "lint: mypy found type errors (above)" >&2; exit 1; }
echo "lint: mypy: clean (-p clusterctl, from the checkout)" >&2

"$bin/mypy" --config-file pyproject.toml tests/fakes.py || { echo "lint: a test fake no longer fits its door (above)" >&2; exit 1; }
echo "lint: mypy: clean (tests/fakes.py: the fakes satisfy the doors' Protocols)" >&2
