#!/usr/bin/env bash
# The whole story on a local testbed (4 Slurm nodes, 8 emulated GPUs each; --compose: as docker-compose services):
#   1. set everything up and start the testbed;
#   2. `clusterctl submit --supervise` the example trainer (3 nodes x 8 GPUs, TP=8, PP=3);
#   3. once it has checkpointed, inject an Xid 79 ("GPU fallen off the bus") on one of its nodes;
#   4. watch: healthd drains the node, the supervisor blames it with evidence, ends the attempt
#      and resubmits without it from the last complete checkpoint; the run completes;
#   5. show where the ranks ran, the final state and the run's report (goodput, advice).
# Slurm: the testbed's default, the newest release (26.05, from Debian sid's root filesystem, built
# on first use in about a minute); `--slurm 22.05|24.11|host` picks another.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tb=.venv/bin/clusterctl-testbed
up=(up)
case ${1:-} in
  --compose) tb="$tb compose" ;;  # the same story on the docker-compose testbed
  --slurm) up+=(--slurm "${2:?--slurm needs a release: 22.05, 24.11, 26.05 or host}") ;;
  "") ;;
  *) echo "main-job: unknown argument ${1}; usage: bash scripts/main-job.sh [--compose | --slurm RELEASE]" >&2
     exit 2 ;;
esac
bash scripts/setup.sh
$tb "${up[@]}"
# The hosts run the project from the testbed's own venv (a root filesystem's, or this checkout's).
clusterctl=/opt/clusterctl/bin/clusterctl
if [[ ${1:-} != --compose ]]; then
  clusterctl=$($tb status --json | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["bindir"])')/clusterctl
fi
records=$($tb status --json 2>/dev/null | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["root"])' \
  2>/dev/null || echo /tmp/ctb)/job-health

scratch=/tmp
if [[ ${1:-} == --compose ]]; then
  # The containers see the testbed's shared directory (its home and scratch filesystem), not /tmp.
  scratch=$($tb status --json | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["shared"])')
fi
run=$(mktemp -d "$scratch/clusterctl-example.XXXXXX")/run
echo "main-job: clusterctl submit examples/toy_trainer.toml --supervise   (run directory $run)" >&2
# The testbed's controller host is the login node: clusterctl runs there, like Slurm's commands.
$tb on ctl "$clusterctl" submit examples/toy_trainer.toml --run-dir "$run" --supervise --job-records "$records" &
supervisor=$!

for _ in $(seq 600); do [[ -d $run/checkpoints/step-00000020 ]] && break; sleep 0.1; done
job=$(find "$run/jobs" -mindepth 1 -maxdepth 1 -printf "%f\n" | sort | head -n 1)
victim=$(.venv/bin/python -c 'import json,sys; print(json.load(open(sys.argv[1]))["slots"][1])' "$run/jobs/$job/rankmap.json")
echo "main-job: checkpoint 20 written; injecting Xid 79 on $victim gpu 3" >&2
$tb inject "$victim" xid 79 --gpu 3
wait "$supervisor"

echo
echo "where each rank ran, per attempt (recorded by every rank itself):"
for dir in "$run"/jobs/*; do
  .venv/bin/python - "$dir" <<'PY'
import json, sys
from pathlib import Path
job = Path(sys.argv[1])
rank_map = json.loads((job / "rankmap.json").read_text())
hosts = {}
for record in (job / "ranks").glob("*.json"):
    r = json.loads(record.read_text())
    hosts.setdefault(r["hostname"], []).append(r["rank"])
placed = all(rank_map["slots"][r // 8] == h for h, ranks in hosts.items() for r in ranks)
print(f"  job {job.name}: slots {' '.join(rank_map['slots'])}; every rank where the map says: {placed}")
PY
done
echo
echo "main-job: final state: $(cat "$run/checkpoints/final.json")"
echo
$tb on ctl "$clusterctl" report "$run"
$tb inject "$victim" clear >/dev/null
$tb on ctl scontrol update NodeName="$victim" State=RESUME
echo
echo "main-job: the testbed stays up: try \`$tb on ctl $clusterctl status $run\`, \`$tb down\`."
