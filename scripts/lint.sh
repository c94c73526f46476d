#!/usr/bin/env bash
# Lint and types:
#   scripts/lint.sh [WHEEL_VENV]
# ruff over the repository (configured in pyproject.toml), then mypy over the packages listed
# below.  mypy cannot follow pyproject's package-dir mapping (launcher/ is clusterctl.launcher)
# through the editable install, so it checks the installed, non-editable wheel in WHEEL_VENV
# (made by scripts/check-wheel.sh; built here when not given), with this checkout's config;
# its messages name the files of the checkout.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
bin=$repo/.venv/bin

# What mypy checks: the whole package.  The core (errors, files, clock, slurm, records) is
# strict; launcher, healthd, prolog and epilog get the default checks plus check_untyped_defs
# (pyproject.toml's [tool.mypy] sections).
typed=(-p clusterctl)

"$bin/ruff" check --quiet --no-fix "$repo"
echo "lint: ruff: clean" >&2

venv=${1:-}
if [[ -z $venv ]]; then
  venv=$(bash scripts/check-wheel.sh | tail -n 1)
  trap 'rm -rf "$(dirname "$venv")"' EXIT
fi
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# From inside site-packages, so that messages start with clusterctl/...; the sed maps each
# mapped package back to its folder in the checkout (clusterctl/launcher/x.py -> launcher/x.py).
status=0
(cd "$site" && "$bin/mypy" --config-file "$repo/pyproject.toml" --cache-dir "$venv/.mypy_cache" \
    --python-executable "$venv/bin/python" "${typed[@]}") >"$venv/mypy.txt" 2>&1 || status=$?
sed -E 's#^clusterctl/(launcher|healthd|prolog|epilog|sbatch_templates)/#\1/#' "$venv/mypy.txt" >&2
[[ $status -eq 0 ]] || { echo "lint: mypy found type errors (above)" >&2; exit 1; }
echo "lint: mypy: clean (${typed[*]})" >&2
