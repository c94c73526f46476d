#!/usr/bin/env bash
# Build clusterctl's wheel from this checkout, install it (not editable) into a fresh virtualenv
# outside the repository, and use it as a user would:
#   scripts/check-wheel.sh [VENV]      (VENV must not exist yet; default: a new directory in /tmp)
# It checks that the wheel installs one import name (`clusterctl`) and its console scripts, that
# the templates load as package data, and that `clusterctl submit examples/toy_trainer.toml
# --dry-run`, `healthd policy` and `clusterctl --help` work from a directory outside the checkout.
# The last line printed is the virtualenv's path (tests/e2e/test_wheel.py runs a job from it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
venv=${1:-$(mktemp -d /tmp/clusterctl-wheel.XXXXXX)/venv}
case $venv in "$repo"/*) echo "check-wheel: put the virtualenv outside the checkout, not $venv" >&2; exit 1 ;; esac
[[ ! -e $venv ]] || { echo "check-wheel: $venv exists already; give a new path" >&2; exit 1; }
python=${PYTHON:-$repo/.venv/bin/python}
work=$(mktemp -d /tmp/clusterctl-wheel-work.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "check-wheel: $*" >&2; exit 1; }

# The sdist first, then the wheel from the sdist (python -m build's default): a file the sdist
# forgets fails here, and no stale build/ directory of the checkout can leak into the wheel.
"$python" -m build --outdir "$work/dist" . >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; fail "build failed"; }
wheel=$(ls "$work"/dist/clusterctl-*.whl)
echo "check-wheel: built $(basename "$wheel")" >&2

# The interpreter that made .venv (not .venv itself): the new venv shares nothing with it.
base=$("$python" -c 'import sys; print(sys._base_executable)')
"$base" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$wheel" >"$work/pip.log" 2>&1 \
  || { cat "$work/pip.log" >&2; fail "pip install $(basename "$wheel") failed"; }

# What the wheel puts into site-packages: the one import name, its metadata, the scripts.
"$venv/bin/python" - "$wheel" "$repo" <<'PY' || exit 1
import os, sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
# Every module of the checkout (clusterctl/ and the parts it links to) is in the wheel.
checkout = set()
for folder, dirs, files in os.walk(os.path.join(sys.argv[2], "clusterctl"), followlinks=True):
    dirs[:] = [d for d in dirs if d != "__pycache__"]
    checkout |= {os.path.relpath(os.path.join(folder, f), sys.argv[2]) for f in files if f.endswith(".py")}
missing = sorted(checkout - set(names))
if missing:
    sys.exit(f"check-wheel: modules of the checkout missing from the wheel: {missing}")
top = sorted({n.split("/")[0] for n in names if not n.startswith("clusterctl-") or "/" not in n})
dist_info = {n.split("/")[0] for n in names if ".dist-info/" in n}
if top != ["clusterctl"]:
    sys.exit(f"check-wheel: the wheel installs import names {top}; want only ['clusterctl']")
if any("testbed" in n for n in names):
    sys.exit("check-wheel: the testbed is in the wheel; it is a separate development-only package")
entry = zipfile.ZipFile(sys.argv[1]).read(f"{dist_info.pop()}/entry_points.txt").decode()
for script in ("clusterctl", "healthd", "clusterctl-prolog", "clusterctl-epilog", "clusterctl-healthcheck"):
    if f"\n{script} = " not in "\n" + entry:
        sys.exit(f"check-wheel: console script {script} missing from the wheel")
PY

# A directory outside the checkout, with only the example in it: nothing from the repository is
# importable, so whatever runs comes from the wheel.
outside=$work/outside
mkdir -p "$outside/examples"
cp examples/toy_trainer.toml examples/toy_trainer.py "$outside/examples/"
cd "$outside"
unset PYTHONPATH
export CLUSTERCTL_RUNS=$work/runs
where=$("$venv/bin/python" -c 'import clusterctl.launcher, sys; print(clusterctl.launcher.__file__)')
[[ $where == "$venv"/* ]] || fail "clusterctl.launcher comes from $where, not the wheel's virtualenv"
"$venv/bin/python" - <<'PY' || exit 1
import importlib.resources, sys
templates = importlib.resources.files("clusterctl.sbatch_templates")
found = sorted(p.name for p in templates.iterdir() if p.name.endswith(".sbatch"))
if found != ["srun.sbatch", "torchrun.sbatch"]:
    sys.exit(f"check-wheel: templates in the wheel: {found}")
healthd = importlib.resources.files("clusterctl.healthd")
for name in ("healthd.example.toml", "systemd/healthd.service", "install.md"):
    if not healthd.joinpath(name).is_file():
        sys.exit(f"check-wheel: clusterctl.healthd/{name} is not in the wheel")
PY
"$venv/bin/clusterctl" --help >"$work/help.txt" || fail "clusterctl --help failed"
grep -q submit "$work/help.txt" || fail "clusterctl --help does not list submit"
"$venv/bin/clusterctl" submit examples/toy_trainer.toml --dry-run >"$work/dry-run.txt" 2>&1 \
  || { cat "$work/dry-run.txt" >&2; fail "clusterctl submit examples/toy_trainer.toml --dry-run failed"; }
grep -q '^# would run: sbatch ' "$work/dry-run.txt" && grep -qx "python=$venv/bin/python" "$work/dry-run.txt" \
  || { cat "$work/dry-run.txt" >&2; fail "the dry run does not show an sbatch script that runs the wheel's Python"; }
"$venv/bin/healthd" policy >"$work/policy.txt" 2>&1 || { cat "$work/policy.txt" >&2; fail "healthd policy failed"; }
grep -q -i xid "$work/policy.txt" || fail "healthd policy does not mention Xids"
for script in healthd clusterctl-prolog clusterctl-epilog clusterctl-healthcheck; do
  [[ -x $venv/bin/$script ]] || fail "$script is not installed"
done
echo "check-wheel: ok: $(basename "$wheel") installs clusterctl only; submit --dry-run, healthd policy, --help work outside the checkout" >&2
echo "$venv"
