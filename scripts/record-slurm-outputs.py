#!/usr/bin/env python3
"""Record the real output of every Slurm command clusterctl runs, from a testbed of each version.

    flock /tmp/clusterctl-e2e.lock .venv/bin/python scripts/record-slurm-outputs.py --slurm 24.11 --slurm 26.05

For each release it brings up a testbed of its own (/tmp/ctbr, namespaces `ctbr-*`; run it under
the e2e lock), puts jobs and nodes into the states the project must read (completed, failed with
exit 3, cancelled, running, pending, NODE_FAIL; a node drained by an admin, one drained by healthd,
one dead), runs each command and writes its stdout to tests/data/slurm/<release>/<name>.(json|txt),
with index.json saying which command, which exit status, which job and node is which.  Outputs are
written as Slurm printed them, never edited.  The testbed is taken down at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from clusterctl.clock import utc
from clusterctl.files import atomic_write
from clusterctl.records.actions import Action
from clusterctl.records.drain_reason import DrainReason
from clusterctl.slurm.jobs import job_line_argv
from clusterctl_testbed.cluster import DAEMON_PATH, Testbed
from clusterctl_testbed.gpu_faults import Fault, inject
from clusterctl_testbed.layout import CONTROLLER, Layout
from clusterctl_testbed.system import TestbedError, wait_for
from clusterctl_testbed.versions import RELEASES

REPO = Path(__file__).resolve().parent.parent
LAYOUT = Layout(root=Path("/tmp/ctbr"), namespace_prefix="ctbr-")
# Commands get a clean environment: no SLURM_* of the caller's own job leaks into what is recorded.
ENV = {"PATH": DAEMON_PATH, "HOME": "/root", "LANG": "C.UTF-8"}
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY"}


def say(message: str) -> None:
    print(f"record: {message}", file=sys.stderr, flush=True)


class Recorder:
    """Runs Slurm commands on the testbed's login host and keeps what they printed."""

    def __init__(self, tb: Testbed, out: Path) -> None:
        self.tb = tb
        self.out = out
        self.files: dict[str, dict[str, object]] = {}

    def slurm(self, *argv: str, check: bool = True) -> str:
        result = self.tb.run_on(CONTROLLER, list(argv), env=dict(ENV), timeout=60, check=check)
        return result.stdout

    def record(self, name: str, argv: list[str], about: str) -> None:
        """Run `argv` and write its stdout as `name` (.json when it parses as JSON, else .txt)."""
        result = self.tb.run_on(CONTROLLER, argv, env=dict(ENV), timeout=60, check=False)
        try:
            json.loads(result.stdout)
            filename = f"{name}.json"
        except ValueError:
            filename = f"{name}.txt"
        atomic_write(self.out / filename, result.stdout)
        entry: dict[str, object] = {"argv": argv, "returncode": result.returncode, "about": about}
        if result.returncode != 0:
            entry["stderr"] = result.stderr.strip()
        self.files[filename] = entry
        say(f"{filename}: exit {result.returncode}, {len(result.stdout)} bytes")


def job_state(rec: Recorder, job_id: str) -> str:
    # `-t all`: 24.05.1 on hides finished jobs otherwise; 22.05 and 23.02 accept it too.
    return rec.slurm("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T", check=False).strip()


def wait_state(rec: Recorder, job_id: str, wanted: set[str], timeout: float) -> None:
    wait_for(lambda: job_state(rec, job_id) in wanted, timeout=timeout,
             what=f"job {job_id} to be {'/'.join(sorted(wanted))} (it is {job_state(rec, job_id)!r})", interval=0.3)


def sacct_states(rec: Recorder, job_ids: list[str]) -> dict[str, str]:
    out = rec.slurm("sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", ",".join(job_ids), check=False)
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def make_states(rec: Recorder) -> tuple[dict[str, str], dict[str, str]]:
    """Jobs and nodes in every state the project reads; returns (job role -> id, node -> role)."""
    tb = rec.tb
    sbatch = ["sbatch", "--parsable", "--no-requeue", "-N1"]
    jobs: dict[str, str] = {}
    jobs["completed"] = rec.slurm(*sbatch, "-w", "node1", "-J", "completed", "--wrap", "true").strip()
    jobs["failed"] = rec.slurm(*sbatch, "-w", "node1", "-J", "failed", "--wrap", "exit 3").strip()
    jobs["cancelled"] = rec.slurm(*sbatch, "-w", "node2", "-J", "cancelled", "--wrap", "sleep 600").strip()
    jobs["node_fail"] = rec.slurm(*sbatch, "-w", "node4", "-J", "node_fail", "--wrap", "sleep 600").strip()
    wait_state(rec, jobs["cancelled"], {"RUNNING"}, 30)
    rec.slurm("scancel", jobs["cancelled"])
    wait_state(rec, jobs["node_fail"], {"RUNNING"}, 30)
    tb.kill_node("node4")
    for role in ("completed", "failed", "cancelled"):
        wait_state(rec, jobs[role], TERMINAL, 60)
    say("waiting for node4's job to fail (slurmd timeout)")
    wait_state(rec, jobs["node_fail"], {"NODE_FAIL"}, 60)
    # Two steps, so sacct and squeue show a job with steps; the second job waits behind it.
    jobs["running"] = rec.slurm("sbatch", "--parsable", "-N1", "-w", "node1", "--exclusive", "-J", "running",
                                "--wrap", "srun true; srun sleep 600").strip()
    wait_state(rec, jobs["running"], {"RUNNING"}, 30)
    jobs["pending"] = rec.slurm("sbatch", "--parsable", "-N1", "-w", "node1", "--exclusive", "-J", "pending",
                                "--wrap", "true").strip()
    wait_state(rec, jobs["pending"], {"PENDING"}, 10)
    rec.slurm("scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=admin: maintenance")
    nodes = {"node1": "running a job (allocated)", "node2": "drained by an admin", "node4": "dead (killed)"}
    inject(tb.nvml_dir("node3"), Fault("xid", gpu=0, value=79))
    try:
        tb.wait_nodes(lambda n: n.state.startswith("drain") and n.reason.startswith("healthd:"), nodes=["node3"],
                      timeout=30, what="healthd to drain node3")
        nodes["node3"] = "drained by healthd (Xid 79)"
    except TestbedError:
        # healthd of this version cannot read Slurm's answers yet: drain as it would, reason and all.
        reason = DrainReason("xid", Action.DRAIN_RESET, utc(time.time()), xid=79, gpu=0).render()
        rec.slurm("scontrol", "update", "NodeName=node3", "State=DRAIN", f"Reason={reason}")
        nodes["node3"] = "drained with healthd's reason by this script (healthd did not drain it itself)"
    # Accounting lags the controller: wait until sacct has every finished job's final state.
    finished = [jobs[r] for r in ("completed", "failed", "cancelled", "node_fail")]
    wait_for(lambda: all(s.split()[0] in TERMINAL for s in sacct_states(rec, finished).values())
             and len(sacct_states(rec, finished)) == len(finished), timeout=60, what="sacct to catch up")
    return jobs, nodes


def record_all(rec: Recorder, jobs: dict[str, str]) -> None:
    every = ",".join(jobs.values())
    r = rec.record
    r("squeue", ["squeue", "--json"], "every job, default filter (clusterctl.slurm.commands.Slurm.queue_json)")
    r("squeue-t-all", ["squeue", "--json", "-t", "all"], "every job slurmctld holds, finished ones included")
    r("squeue-j-running", ["squeue", "--json", "-j", jobs["running"]], "is -j honoured")
    r("squeue-j-failed-t-all", ["squeue", "--json", "-t", "all", "-j", jobs["failed"]], "one finished job")
    several = ",".join(jobs[r] for r in ("completed", "failed", "running"))
    r("squeue-t-all-j-several", ["squeue", "--json", "-t", "all", "-j", several],
      "the supervisor's and status's call on 24.05.1+: several jobs, finished ones included")
    r("squeue-t-all-j-unknown", ["squeue", "--json", "-t", "all", "-j", "999999"],
      "a job the controller no longer holds (past MinJobAge)")
    r("squeue-only-job-state", ["squeue", "--only-job-state", "--json", "-t", "all"], "24.05+: the cheap state RPC")
    r("squeue-only-job-state-j-several", ["squeue", "--only-job-state", "--json", "-t", "all", "-j", several],
      "24.05+: the cheap state RPC for several jobs")
    for role in ("completed", "failed", "cancelled", "node_fail", "running", "pending"):
        r(f"squeue-job-line-{role}", job_line_argv(jobs[role]),
          "one job as a text line: one REQUEST_JOB_INFO_SINGLE (the supervisor's poll, Slurm.job)")
    r("squeue-job-line-unknown", job_line_argv("999999"), "a job the controller no longer holds")
    r("scontrol-show-job-failed", ["scontrol", "show", "job", jobs["failed"]],
      "one job's exit code before 24.05.1 (Slurm.job_exit)")
    r("scontrol-show-job-running", ["scontrol", "show", "job", jobs["running"]], "a job still running")
    r("squeue-running-on-node1", ["squeue", "-h", "-w", "node1", "-t", "RUNNING", "-o", "%A"],
      "clusterctl.slurm.nodes: running jobs on a node")
    r("sacct", ["sacct", "--json", "-j", every], "every job with its steps (Slurm.sacct)")
    r("sacct-failed", ["sacct", "--json", "-j", jobs["failed"]], "the job that exited 3")
    r("sacct-unknown", ["sacct", "--json", "-j", "999999"], "a job accounting never saw")
    r("sinfo", ["sinfo", "--json"], "every node (Slurm.nodes_json)")
    r("sinfo-p-gpu", ["sinfo", "--json", "-p", "gpu"], "one partition (SlurmNode.partition)")
    for node in ("node1", "node2", "node3", "node4"):
        r(f"sinfo-n-{node}", ["sinfo", "--json", "-n", node], "one node (SlurmNode.state)")
        r(f"scontrol-show-node-{node}", ["scontrol", "show", "node", node, "--json"], "one node, 23.02+")
        r(f"sinfo-one-node-{node}", ["sinfo", "-h", "-n", node, "-o", "%N|%T|%P|%E"],
          "one node as text: one single-node RPC (REQUEST_NODE_INFO_SINGLE) on every release (SlurmNode.state)")
    r("sinfo-N", ["sinfo", "--json", "-N"], "every node, one group per node (per-node reasons on 23.02+)")
    r("sinfo-N-p-gpu", ["sinfo", "--json", "-N", "-p", "gpu"], "one partition, one group per node")
    r("scontrol-show-node", ["scontrol", "show", "node", "--json"],
      "every node, 23.02+ (Slurm.nodes_json, SlurmNode.partition_nodes)")
    r("sinfo-nodes", ["sinfo", "-h", "-N", "-o", "%N|%T"], "Slurm.idle_nodes")
    r("scontrol-show-partition-gpu", ["scontrol", "show", "partition", "gpu"],
      "one partition's size (TotalNodes): a cheap REQUEST_PARTITION_INFO (SlurmNode.partition_size)")
    r("sinfo-share-p-gpu", ["sinfo", "-h", "-p", "gpu", "-o", "%D|%T|%E"],
      "one partition grouped by state and reason: healthd's breaker (SlurmNode.partition_share)")
    r("sinfo-nodes-p-gpu", ["sinfo", "-h", "-N", "-o", "%N|%T", "-p", "gpu"], "Slurm.idle_nodes with a partition")
    r("scontrol-show-topology", ["scontrol", "show", "topology"], "Slurm.topology")
    r("scontrol-show-config", ["scontrol", "show", "config"], "Slurm.config")
    r("scontrol-show-hostnames", ["scontrol", "show", "hostnames", "node[1-4],ctl"], "hostlist reference")
    r("sbatch-version", ["sbatch", "--version"], "Slurm.version")
    r("sinfo-version", ["sinfo", "--version"], "the release, as sinfo says it")
    r("sbatch-parsable", ["sbatch", "--parsable", "-N1", "-w", "node1", "-J", "parsable", "--wrap", "true"],
      "what `sbatch --parsable` prints (Slurm.sbatch); this job joins the pending queue")


def record_release(name: str, out_root: Path) -> None:
    tb = Testbed(LAYOUT)
    out = out_root / name
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        old.unlink()
    try:
        tb.up(timeout=90, slurm=name)
        rec = Recorder(tb, out)
        running = tb.running()
        say(f"{name}: {running.version}")
        jobs, nodes = make_states(rec)
        record_all(rec, jobs)
        index = {
            "release": name,
            "slurm": running.version,
            "recorded": utc(time.time()),
            "by": "scripts/record-slurm-outputs.py",
            "jobs": jobs,
            "job_notes": {"failed": "exit 3", "node_fail": "node4 killed while it ran",
                          "running": "two steps (`srun true; srun sleep 600`), exclusive on node1",
                          "pending": "waits for node1 (Resources)"},
            "nodes": nodes,
            "files": dict(sorted(rec.files.items())),
        }
        atomic_write(out / "index.json", json.dumps(index, indent=1) + "\n")
    finally:
        tb.down()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slurm", action="append", choices=[r for r in RELEASES if r != "host"], required=True)
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "data" / "slurm")
    args = parser.parse_args()
    for name in args.slurm:
        record_release(name, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
