#!/usr/bin/env bash
# Redraw docs/img/report.png, the README's picture of `clusterctl report --html`: the recorded
# main-job story (tests/data/runs/xid79-resubmit: an Xid 79, the node blamed, the run resubmitted
# and completed) drawn by clusterctl and rendered by Debian's headless Chromium.
#   bash scripts/report-picture.sh            (after `CLUSTERCTL_BROWSER=1 bash scripts/setup.sh`)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v chromium >/dev/null || { echo "report-picture: needs chromium (CLUSTERCTL_BROWSER=1 bash scripts/setup.sh)" >&2; exit 1; }
work=$(mktemp -d /tmp/clusterctl-picture.XXXXXX)
trap 'rm -rf "$work"' EXIT
run=$work/runs/supervised-20261126-042840
mkdir -p "$work/runs"
cp -r tests/data/runs/xid79-resubmit "$run"
.venv/bin/clusterctl report "$run" --html "$work/report.html" >/dev/null
# As root, Chromium will not start its sandbox; the page is our own and runs no script (its CSP forbids it).
sandbox=()
[[ $(id -u) -ne 0 ]] || sandbox=(--no-sandbox)
chromium --headless=new "${sandbox[@]}" --disable-gpu --hide-scrollbars --no-first-run --force-device-scale-factor=1 \
  --user-data-dir="$work/profile" --window-size=1040,1860 --screenshot="$work/report.png" \
  "file://$work/report.html" 2>/dev/null
mkdir -p docs/img
mv "$work/report.png" docs/img/report.png
echo "report-picture: docs/img/report.png ($(stat -c %s docs/img/report.png) bytes)" >&2
