#!/usr/bin/env bash
# Set up everything clusterctl and its testbed need on a Debian machine, as root:
# Debian packages (Python, compiler, Slurm, munge, MariaDB, shellcheck) and a virtualenv
# at .venv with clusterctl installed (editable) and its test extras (pytest, ruff, mypy, build),
# and the testbed, a separate development-only package; with CLUSTERCTL_TORCH=1 also PyTorch
# (CPU build) for the PyTorch example and its tests, and Lightning and transformers for the framework
# callbacks' tests; with CLUSTERCTL_BROWSER=1 also Debian's
# headless-capable Chromium, which the tests of `clusterctl report --html` render the page with
# (skipped without it; scripts/test.sh asks for both); with CLUSTERCTL_PEERS=1 also a separate virtualenv
# .venv-peers with the tools bench/peers_bench.py compares clusterctl with (NVIDIA's ft_launcher, torchft),
# kept out of .venv. Idempotent.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ $(id -u) -ne 0 ]]; then
  echo "setup: run as root (the testbed installs Debian packages and creates namespaces)" >&2
  exit 1
fi

packages=(gcc libc6-dev iproute2 util-linux procps shellcheck
          munge slurmctld slurmd slurm-client slurmdbd slurmrestd mariadb-server-core mariadb-client-core
          fuse3)  # fuse3: libfuse3 for the testbed's hung shared mount (tests/e2e/test_active_health.py)
# Debian's Python only where no usable python3 (with venv) is on the PATH already.
if ! { command -v python3 >/dev/null && python3 -c 'import venv, ensurepip' 2>/dev/null; }; then
  packages+=(python3 python3-venv python3-dev)
fi
# CLUSTERCTL_BROWSER=1: Chromium for tests/unit/test_report_in_a_browser.py (about 400 MB installed, with
# the libraries a bookworm machine with Slurm lacked).  Users never need it: the page opens in any browser.
[[ ${CLUSTERCTL_BROWSER:-0} == 1 ]] && packages+=(chromium)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "setup: clusterctl needs Python 3.11 or newer; python3 is $(python3 --version)" >&2
  exit 1
fi
[[ -x .venv/bin/python ]] || python3 -m venv .venv
# CLUSTERCTL_TORCH=1: also PyTorch's CPU build (the `torch` extra, ~750 MB, about 45 s) for
# examples/torch_trainer.py and the tests that run it (skipped without it), and Lightning, transformers
# and accelerate (the `frameworks` extra, ~210 MB installed, about 45 s more) for the framework callbacks'
# tests in the real training loops (skipped without them).
extras="test"
[[ ${CLUSTERCTL_TORCH:-0} == 1 ]] && extras="test,torch,frameworks"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$extras]" -e ./testbed
# CLUSTERCTL_PEERS=1: the peers' extra in a venv of its own (never in .venv: their dependencies, pynvml
# among them, must not shadow clusterctl's), with the `torch` extra's pins (PyTorch's CPU build, numpy for
# DCP) read from pyproject.toml, so both venvs run the same PyTorch.
if [[ ${CLUSTERCTL_PEERS:-0} == 1 ]]; then
  [[ -x .venv-peers/bin/python ]] || python3.11 -m venv .venv-peers
  pins=$(.venv/bin/python -c 'import tomllib; o = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]; print(" ".join(o["torch"] + o["peers"]))')
  # shellcheck disable=SC2086  # one word per pin
  .venv-peers/bin/python -m pip install -q --disable-pip-version-check $pins
  echo "setup: .venv-peers/bin has ft_launcher, torchft_lighthouse, torchrun (bench/peers_bench.py --peers-python)" >&2
fi
echo "setup: ready (.venv/bin has clusterctl, healthd, clusterctl-testbed)" >&2
