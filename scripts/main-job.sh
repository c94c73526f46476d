#!/usr/bin/env bash
# Set everything up, bring the local testbed up (4 Slurm nodes, 8 emulated GPUs each) and
# run the example trainer on 3 nodes × 8 ranks through Slurm, then show where it ran.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
tb=.venv/bin/clusterctl-testbed
$tb up

run=$(mktemp -d /tmp/clusterctl-example.XXXXXX)
echo "main-job: submitting the toy trainer on 3 nodes x 8 ranks; checkpoints in $run/ckpt" >&2
$tb on ctl sbatch -W -N3 --ntasks-per-node=8 --output="$run/job.out" \
  examples/toy_trainer.sbatch "$run/ckpt" --steps 50 --checkpoint-every 10 --log-every 25
grep -F "rank 0]" "$run/job.out"
echo
echo "ranks per host (each rank reported its last step):"
grep -F "step 50 took" "$run/job.out" | sed -E 's/^\[([^ ]+) rank.*/\1/' | sort | uniq -c
echo
$tb on ctl sacct --format=JobID,JobName,State,ExitCode,NodeList -X
echo
echo "main-job: final state: $(cat "$run/ckpt/final.json")"
echo "main-job: the testbed stays up: try \`$tb on ctl sinfo\`, \`$tb inject node3 xid 79 --gpu 3\`, \`$tb down\`."
