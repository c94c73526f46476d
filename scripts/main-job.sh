#!/usr/bin/env bash
# Set everything up, bring the local testbed up (4 Slurm nodes, 8 emulated GPUs each) and
# submit the example trainer with `clusterctl submit` (3 nodes x 8 GPUs, TP=8, PP=3), then
# show where every rank ran according to the rank map.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
tb=.venv/bin/clusterctl-testbed
clusterctl=$PWD/.venv/bin/clusterctl
$tb up

run=$(mktemp -d /tmp/clusterctl-example.XXXXXX)/run
echo "main-job: clusterctl submit examples/toy_trainer.toml (run directory $run)" >&2
# The testbed's controller host is the login node: Slurm commands run there.
$tb on ctl "$clusterctl" submit examples/toy_trainer.toml --run-dir "$run" --wait
job=$(ls "$run/jobs")
echo
grep -F "clusterctl: rank map" "$run/logs/$job.out"
grep -F "rank 0]" "$run/logs/$job.out"
echo
echo "where each rank ran (recorded by the rank itself; the map's order):"
.venv/bin/python - "$run/jobs/$job" <<'PY'
import json, sys
from pathlib import Path
job = Path(sys.argv[1])
rank_map = json.loads((job / "rankmap.json").read_text())
for slot, node in enumerate(rank_map["slots"]):
    ranks = [json.loads((job / "ranks" / f"{r}.json").read_text()) for r in range(slot * 8, slot * 8 + 8)]
    ok = all(r["hostname"] == node for r in ranks)
    print(f"  slot {slot}: {node}  ranks {slot * 8}-{slot * 8 + 7}  {'all on ' + node if ok else 'MISPLACED'}")
PY
echo
echo "main-job: final state: $(cat "$run/checkpoints/final.json")"
echo "main-job: the testbed stays up: try \`$tb on ctl $clusterctl status $run\`, \`$tb inject node3 xid 79 --gpu 3\`, \`$tb down\`."
