#!/usr/bin/env bash
# The whole end-to-end suite on every Slurm release the testbed runs, one pytest session each:
#   bash scripts/test-matrix.sh                    22.05, 24.11 and 26.05 (each from its Debian root filesystem)
#   bash scripts/test-matrix.sh 24.11 host         only these (`host`: this machine's own Slurm packages)
#   bash scripts/test-matrix.sh 26.05 -- -x -k hooks   arguments after -- go to pytest
#   bash scripts/test-matrix.sh built -- -m slurm_versions   the version stories on every release built
#                                                  from SchedMD's source (23.02 23.11 24.05 25.05 25.11)
#   bash scripts/test-matrix.sh all -- -m slurm_versions     ... on every release the testbed runs
# Each release's root filesystem is built on first use (about a minute; a release built from source
# about 6 min, and it needs the source once: CLUSTERCTL_SLURM_SOURCE=DIR, see docs/testbed.md) and cached.  At the end a
# table says, per release and per part of the project, how many tests passed and failed; the
# JUnit reports stay in $CLUSTERCTL_MATRIX_DIR (default: a new directory in /tmp).
# Set CLUSTERCTL_TEST_TESTBED=<name> to run on a testbed of your own (/tmp/ctb-<name>).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

known() {  # the testbed's releases: all, or only those built from SchedMD's source
  .venv/bin/python -c 'import sys
from clusterctl_testbed.versions import HOST, RELEASES
print(" ".join(n for n, r in RELEASES.items() if n != HOST and (sys.argv[1] == "all" or r.built_from_source)))' "$1"
}
releases=()
while [[ $# -gt 0 && $1 != -- ]]; do
  case $1 in
    all|built) read -ra listed <<<"$(known "$1")"; releases+=("${listed[@]}") ;;
    *) releases+=("$1") ;;
  esac
  shift
done
[[ ${1:-} == -- ]] && shift
[[ ${#releases[@]} -gt 0 ]] || releases=(22.05 24.11 26.05)
out=${CLUSTERCTL_MATRIX_DIR:-$(mktemp -d /tmp/clusterctl-matrix.XXXXXX)}
mkdir -p "$out"

status=0
for release in "${releases[@]}"; do
  echo "test-matrix: Slurm $release: the end-to-end suite" >&2
  started=$SECONDS
  rc=0
  CLUSTERCTL_TEST_SLURM=$release .venv/bin/python -m pytest tests/e2e -q -p no:cacheprovider \
    --junitxml="$out/$release.xml" "$@" || rc=$?
  echo "test-matrix: Slurm $release: pytest exited $rc after $((SECONDS - started)) s" >&2
  [[ $rc -eq 0 ]] || status=1
done

.venv/bin/python - "$out" "${releases[@]}" <<'PY'
"""Per release and part: passed/failed (skipped not counted), from the JUnit reports."""
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

PARTS = {"test_submit": "submit/rank map", "test_healthd": "healthd", "test_hooks": "prolog/epilog",
         "test_supervisor": "supervisor", "test_slurm_versions": "job states/topology", "test_wheel": "wheel",
         "test_testbed": "testbed", "test_trainer_on_testbed": "trainer", "test_teardown": "teardown"}
out, releases = Path(sys.argv[1]), sys.argv[2:]
print(f"\n{'part':22}" + "".join(f"{r:>18}" for r in releases))
rows: dict[str, dict[str, list[int]]] = {}
for release in releases:
    try:
        root = ET.parse(out / f"{release}.xml").getroot()
    except (OSError, ET.ParseError):
        continue
    for case in root.iter("testcase"):
        module = case.get("classname", "").rsplit(".", 1)[-1]
        outcome = {child.tag for child in case}
        if "skipped" in outcome:
            continue
        counts = rows.setdefault(PARTS.get(module, module), {}).setdefault(release, [0, 0])
        counts[1 if outcome & {"failure", "error"} else 0] += 1
for part in sorted(rows):
    cells = [rows[part].get(r) for r in releases]
    texts = [f"{c[0]} ok {c[1]} failed" if c else "-" for c in cells]
    print(f"{part:22}" + "".join(f"{t:>18}" for t in texts))
print(f"\nJUnit reports: {out}")
PY
exit "$status"
