"""Benchmark what one `clusterctl status --watch` pays per look at a job with multi-level checkpoints.

    .venv/bin/python bench/status_watch_bench.py [--sizes 1250,12500] [--trials 5]

What is REAL: the watch's reads (`launcher/login/watch.py: RunFiles`) and everything status builds from
them (`use_cases.gather_status`: the journal, the agent's summary, the spec, the checkpoints found as
`report` finds them, the job's inventory read and planned over as the agent plans a resume, the goodput so
far).  What is SIMULATED: Slurm (one RUNNING job on every node, answered at once) and the nodes' holdings:
N nodes, checkpoints 1100 and 1200 each saved by every node with a buddy copy on its neighbour, 1100 also
flushed (complete.json): 5 copies a node, as `keep = 2` leaves them.  Shared storage is this machine's disk.

Two looks are timed, each --trials times (median, min-max):
  unchanged: nothing was written since the last look (the stats of what the watch reads, nothing more);
  inventory: the job's agent rewrote its inventory (at most every 30 s while holdings change): the status
             is rebuilt and the inventory read and planned over again.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from clusterctl.launcher.login.watch import RunFiles  # noqa: E402
from clusterctl.launcher.pure.spec import parse_spec  # noqa: E402
from clusterctl.launcher.shared.checkpoint_inventory import (  # noqa: E402
    FlushedCheckpoint, inventory_text, write_complete, write_inventory,
)
from clusterctl.launcher.shared.runs import RunDir, create_run  # noqa: E402
from clusterctl.records.checkpoint_holdings import CheckpointHoldings, HeldCopy  # noqa: E402
from clusterctl.records.run_journal import Submitted  # noqa: E402
from clusterctl.slurm import hostlist  # noqa: E402
from clusterctl.slurm.jobs import JobReport  # noqa: E402

T0 = 1_800_000_000.0


class OneRunningJob:
    """Slurm as the watch asks it: job 7 RUNNING on every node."""

    def __init__(self, nodes: list[str]) -> None:
        self.nodes = hostlist.compress(nodes)

    def queue(self, job_ids=()):
        return {j: JobReport(j, "bench", "RUNNING", "None", self.nodes, None, None, T0, T0 + 10.0, 0.0)
                for j in job_ids}

    def accounting(self, job_ids):
        return {}


def a_run(root: Path, size: int) -> tuple[RunDir, list[str], str]:
    text = (REPO / "examples" / "toy_trainer.toml").read_text().replace(
        'validator = "manifest"\n', "tiers = true\n").replace('time = "10:00"\n', 'time = "10:00"\ntotal_steps = 5000\n')
    run = create_run(root / "run", parse_spec(text, "bench.toml", base_dir=REPO / "examples"), text)
    run.record(Submitted(at=T0, attempt=1, job_id="7"))
    run.job_dir("7").mkdir(parents=True)
    nodes = [f"gpu{i:05d}" for i in range(1, size + 1)]
    holdings = {}
    for slot, node in enumerate(nodes):
        kept_for = (slot - 1) % size
        copies = [HeldCopy(step, node, "local", slot, size, T0 + step, 2.0) for step in (1100, 1200)]
        copies += [HeldCopy(step, nodes[kept_for], "buddy", kept_for, size, T0 + step + 1, 2.0) for step in (1100, 1200)]
        copies.append(HeldCopy(1100, node, "shared", slot, size, T0 + 1105, 2.0))
        holdings[node] = CheckpointHoldings(node, tuple(copies), T0 + 1200)
    write_complete(run.path / "checkpoints", FlushedCheckpoint(1100, tuple(nodes), 2.0))
    inventory = inventory_text(holdings)
    write_inventory(run.job_dir("7"), inventory)
    return run, nodes, inventory


def measure(size: int, trials: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix="watch-bench-") as root:
        run, nodes, inventory = a_run(Path(root), size)
        reads = RunFiles(run, OneRunningJob(nodes), lambda note: print(note, file=sys.stderr), now=lambda: T0 + 1300)
        shown = reads.status(True)
        assert shown is not None and shown.checkpoint is not None and shown.checkpoint.step == 1200, shown
        times: dict[str, list[float]] = {"unchanged": [], "inventory": []}
        for _ in range(trials):
            began = time.perf_counter()
            assert reads.status(False) is None
            times["unchanged"].append(time.perf_counter() - began)
            write_inventory(run.job_dir("7"), inventory + " ")  # the agent's next inventory: its stat changes
            inventory += " "
            began = time.perf_counter()
            assert reads.status(False) is not None
            times["inventory"].append(time.perf_counter() - began)
        return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1250,12500")
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    print("nodes   look        median     min-max")
    for size in (int(s) for s in args.sizes.split(",")):
        for look, values in measure(size, args.trials).items():
            shown = [f"{v:.3g} s" if v >= 1 else f"{v * 1e3:.3g} ms"
                     for v in (statistics.median(values), min(values), max(values))]
            print(f"{size:<7} {look:<11} {shown[0]:<10} {shown[1]}-{shown[2]}")


if __name__ == "__main__":
    main()
