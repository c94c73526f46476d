"""Benchmark the whole recovery: fault injected → training stepping again on healthy nodes.

    sudo .venv/bin/python bench/recovery_bench.py [--trials 5]

Each trial supervises the example trainer (3 nodes × 8 ranks, TP=8 PP=3, a step every 0.1 s,
a checkpoint every 10 steps) on its own testbed (/tmp/ctb-recovery), injects Xid 79 on a GPU
of the second node after the checkpoint at step 20, and times each stage from the run's
journal (written by the supervisor) and the new attempt's files, watched every 20 ms:

  detect    injection → the supervisor sees the node drained by healthd and ends the attempt
  job end   → the attempt is terminal in Slurm and the decision is journaled
  submit    → sbatch of the next attempt returned
  start     → the new job computed its rank map (queue, allocation, prolog, batch script)
  resume    → rank 0 reports it resumed from the checkpoint
  step      → the first training step after the resume
Writes bench/results/recovery.json.

    sudo .venv/bin/python bench/recovery_bench.py --compare [--trials 5]

Recovery inside the allocation against resubmission, on an idle and on a busy queue: the same
job on 2 nodes with one spare (TP=8, PP=2, exclusive nodes), `restart.recover` = in-allocation or
resubmit.  Busy: the fourth node runs another job and one more job waits for any node (both
`sleep --busy-seconds`), as on a full cluster.  Stages for in-allocation, from the journal's
`recovered-in-allocation` event and the new step's files: detect (injection → the agent ended the
step), give back (shrink), plan + launch, resume, step.  With `--faults kill-batch-host` (the
default runs both) the node running the agent and rank 0 is powered off instead: its standby agent
on the spare takes the job over once Slurm declares the node gone (SlurmdTimeout=5 on the testbed).
Writes bench/results/recovery_compare.json.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from stats import percentile  # noqa: E402

from clusterctl.records.rank_map import rank_map_path, read_rank_map  # noqa: E402
from clusterctl.records.run_journal import read_run_journal  # noqa: E402
from clusterctl.slurm import hostlist  # noqa: E402
from clusterctl_testbed.cluster import Testbed  # noqa: E402
from clusterctl_testbed.gpu_faults import Fault, inject  # noqa: E402
from clusterctl_testbed.layout import Layout  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
LAYOUT = Layout(root=Path("/tmp/ctb-recovery"), namespace_prefix="ctbr-")
STAGES = ("detect", "job end", "submit", "start", "resume", "step")
SPEC = """\
[job]
name = "recovery-bench"
nodes = 3
[launch]
command = ["python3", "toy_trainer.py", "--checkpoint-dir", "{{checkpoint_dir}}", "--steps", "2000",
           "--checkpoint-every", "10", "--step-time", "0.1", "--log-every", "1", "--peer-timeout", "15"]
workdir = "{examples}"
[parallel]
tp = 8
pp = 3
[checkpoint]
dir = "{{run_dir}}/checkpoints"
validator = "manifest"
resume_args = ["--resume", "{{path}}"]
[restart]
poll_seconds = 0.5
"""


def _events(run: Path) -> dict[str, list]:
    found: dict[str, list] = {}
    for event in read_run_journal(run / "journal.jsonl").events:
        found.setdefault(str(event.event), []).append(event)
    return found


def _wait(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise RuntimeError(f"timed out waiting for {what}")


def trial(tb: Testbed, work: Path, number: int, records: str) -> dict[str, float]:
    run = work / f"run-{number}"
    spec = work / f"spec-{number}.toml"
    spec.write_text(SPEC.format(examples=REPO / "examples"))
    cli = [*tb.enter("ctl", cwd=str(REPO)), sys.executable, "-c", "from clusterctl.launcher.login.cli import main; main()"]
    supervisor = subprocess.Popen([*cli, "submit", str(spec), "--run-dir", str(run), "--supervise",
                                   "--job-records", records], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        _wait(lambda: (run / "checkpoints" / "step-00000020").exists(), 90, "the step-20 checkpoint")
        first_job = _events(run)["submitted"][-1].job_id  # the attempt that is training now
        node = read_rank_map(run / "jobs" / first_job).slots[1]
        injected = time.time()
        inject(tb.nvml_dir(node), Fault("xid", gpu=number % 8, value=79))
        attempts = len(_events(run)["submitted"])
        second = _wait(lambda: len(_events(run).get("submitted", [])) > attempts and _events(run)["submitted"][-1],
                       60, "the next attempt")
        job_dir = run / "jobs" / second.job_id
        rank_map = _wait(lambda: rank_map_path(job_dir).exists() and rank_map_path(job_dir), 60, "rank map")
        log = run / "logs" / f"{second.job_id}.out"

        def seen(pattern: str):
            return log.exists() and re.search(pattern, log.read_text(errors="replace"), re.M) and time.time()
        resumed = _wait(lambda: seen(r"rank 0\] resumed from"), 60, "the resume")
        stepped = _wait(lambda: seen(r"rank 0\] step \d+ took"), 60, "a step after the resume")
        events = _events(run)
        decided = next(e for e in events["decided"] if e.job_id == first_job)
        ending = next((e.at for e in events.get("ending", []) if e.job_id == first_job), decided.at)
        marks = [injected, ending, decided.at, second.at, rank_map.stat().st_mtime, resumed, stepped]
        result = {stage: round(b - a, 3) for stage, a, b in zip(STAGES, marks, marks[1:])}
        result["total"] = round(stepped - injected, 3)
        result["node"] = node
        return result
    finally:
        subprocess.run([*cli, "cancel", str(run)], capture_output=True)
        supervisor.wait(timeout=60)
        if "node" in locals():
            inject(tb.nvml_dir(node), Fault("clear"))
        # healthd resumes a node it drained once its GPUs read clean a few times in a row
        # (resume_when_clean); forcing it earlier meets a prolog that still trusts the fault.
        deadline = time.time() + 60
        while not all(n.state == "idle" and n.responding for n in tb.nodes()):
            if time.time() > deadline - 30:
                tb.run_on("ctl", ["scontrol", "update", "NodeName=ALL", "State=RESUME"], check=False)
            if time.time() > deadline:
                raise RuntimeError(f"nodes not back: {tb.nodes()}")
            time.sleep(0.5)


COMPARE_SPEC = """\
[job]
name = "recovery-compare"
nodes = 2
spare_nodes = 1
sbatch_options = ["--exclusive"]
[launch]
command = ["python3", "toy_trainer.py", "--checkpoint-dir", "{{checkpoint_dir}}", "--steps", "2000",
           "--checkpoint-every", "10", "--step-time", "0.1", "--log-every", "1", "--peer-timeout", "15"]
workdir = "{examples}"
[parallel]
tp = 8
pp = 2
[checkpoint]
dir = "{{run_dir}}/checkpoints"
validator = "manifest"
resume_args = ["--resume", "{{path}}"]
[restart]
poll_seconds = 0.5
recover = "{recover}"
"""


def compare_trial(tb: Testbed, work: Path, label: str, recover: str, busy: bool, number: int, records: str,
                  busy_seconds: int, fault: str = "xid") -> dict[str, float | str]:
    """One fault, one way of recovering: seconds from the injection to rank 0 stepping again.  `fault`:
    Xid 79 on a GPU of the second node of the map, or `kill-batch-host` (the allocation's first node,
    where the agent and rank 0 run, powered off: its standby on the spare takes the job over)."""
    run = work / f"{label}-{number}"
    spec = work / f"{label}-{number}.toml"
    spec.write_text(COMPARE_SPEC.format(examples=REPO / "examples", recover=recover))
    cli = [*tb.enter("ctl", cwd=str(REPO)), sys.executable, "-c", "from clusterctl.launcher.login.cli import main; main()"]
    supervisor = subprocess.Popen([*cli, "submit", str(spec), "--run-dir", str(run), "--supervise",
                                   "--job-records", records], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        _wait(lambda: (run / "checkpoints" / "step-00000020").exists(), 90, "the step-20 checkpoint")
        job = _events(run)["submitted"][-1].job_id
        if busy:
            for name in ("filler", "waiting"):
                tb.run_on("ctl", ["sbatch", "-N1", "--exclusive", "-J", name, "--wrap", f"sleep {busy_seconds}"])
            _wait(lambda: tb.run_on("ctl", ["squeue", "-h", "-n", "waiting", "-o", "%T"]).stdout.strip() == "PENDING",
                  30, "a waiting job")
        rank_map = read_rank_map(run / "jobs" / job)
        if fault == "kill-batch-host":
            node = hostlist.expand(rank_map.nodelist)[0]
            injected = time.time()
            tb.kill_node(node)
        else:
            node = rank_map.slots[1]
            injected = time.time()
            inject(tb.nvml_dir(node), Fault("xid", gpu=number % 8, value=79))
        if recover == "in-allocation":
            event = _wait(lambda: _events(run).get("recovered-in-allocation", [None])[-1], 120, "the restart")
            job_dir = run / "jobs" / job / "restart-1"
            log = run / "logs" / f"{job}.out"
            before = len(log.read_text(errors="replace")) if log.exists() else 0
        else:
            second = _wait(lambda: len(_events(run).get("submitted", [])) > 1 and _events(run)["submitted"][-1],
                           busy_seconds + 120, "the next attempt")
            job_dir = run / "jobs" / second.job_id
            log = run / "logs" / f"{second.job_id}.out"
            before = 0
        _wait(lambda: rank_map_path(job_dir).exists(), busy_seconds + 120, "the new rank map")

        def seen(pattern: str):
            return log.exists() and re.search(pattern, log.read_text(errors="replace")[before:], re.M) and time.time()
        resumed = _wait(lambda: seen(r"rank 0\] resumed from"), busy_seconds + 120, "the resume")
        stepped = _wait(lambda: seen(r"rank 0\] step \d+ took"), 60, "a step after the resume")
        result: dict[str, float | str] = {"node": node, "resumed": round(resumed - injected, 3),
                                          "total": round(stepped - injected, 3)}
        if recover == "in-allocation":
            phases = dict(event.phases)
            result |= {"step ended": round(event.at - sum(phases.values()) - injected + phases["end_step"], 3),
                       **{k: v for k, v in phases.items() if k != "end_step"}}
        return result
    finally:
        subprocess.run([*cli, "cancel", str(run)], capture_output=True)
        supervisor.wait(timeout=60)
        tb.run_on("ctl", ["scancel", "-n", "filler,waiting"], check=False)
        if "node" in locals() and fault == "kill-batch-host":
            tb.boot_node(node)
        elif "node" in locals():
            inject(tb.nvml_dir(node), Fault("clear"))
        deadline = time.time() + 60
        while not all(n.state == "idle" and n.responding for n in tb.nodes()):
            if time.time() > deadline - 30:
                tb.run_on("ctl", ["scontrol", "update", "NodeName=ALL", "State=RESUME"], check=False)
            if time.time() > deadline:
                raise RuntimeError(f"nodes not back: {tb.nodes()}")
            time.sleep(0.5)


def compare(tb: Testbed, trials: int, busy_seconds: int, faults: tuple[str, ...] = ("xid", "kill-batch-host")) -> None:
    work = Path("/tmp/clusterctl-recovery-compare")
    subprocess.run(["rm", "-rf", str(work)], check=True)
    work.mkdir()
    records = str(LAYOUT.root / "job-health")
    results: dict[str, list[dict[str, float | str]]] = {}
    cases = [(label, recover, busy, "xid") for label, recover, busy in (
        ("in-allocation, busy queue", "in-allocation", True), ("resubmission, busy queue", "resubmit", True),
        ("in-allocation, idle queue", "in-allocation", False), ("resubmission, idle queue", "resubmit", False))]
    cases += [(f"batch host killed, {how}, {label}", recover, busy, "kill-batch-host")
              for label, busy in (("busy queue", True), ("idle queue", False))
              for how, recover in (("in-allocation", "in-allocation"), ("resubmission", "resubmit"))]
    for label, recover, busy, fault in cases:
        if fault not in faults:
            continue
        slug = label.replace(", ", "-").replace(" ", "-")
        results[label] = [compare_trial(tb, work, slug, recover, busy, n, records, busy_seconds, fault)
                          for n in range(trials)]
        totals = [float(t["total"]) for t in results[label]]
        print(f"{label:28s} fault → stepping again: median {statistics.median(totals):6.2f} s "
              f"[{min(totals):.2f}–{max(totals):.2f}] over {len(totals)}", flush=True)
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    summary = {label: {key: {"median": round(statistics.median(float(t[key]) for t in rows), 3),
                             "min": round(min(float(t[key]) for t in rows), 3),
                             "max": round(max(float(t[key]) for t in rows), 3)}
                       for key in rows[0] if key != "node"} for label, rows in results.items()}
    (out / "recovery_compare.json").write_text(json.dumps({"busy_seconds": busy_seconds, "trials": results,
                                                           "summary": summary}, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--compare", action="store_true", help="in-allocation against resubmission, idle and busy")
    parser.add_argument("--busy-seconds", type=int, default=45, help="how long the busy queue's jobs run")
    parser.add_argument("--faults", default="xid,kill-batch-host",
                        help="with --compare: xid (a GPU of the second node), kill-batch-host (the node running "
                             "the agent and rank 0, powered off), or both, comma-separated")
    args = parser.parse_args()
    tb = Testbed(LAYOUT)
    if args.compare:
        tb.up(timeout=90, slurm="host")
        try:
            compare(tb, args.trials, args.busy_seconds, tuple(args.faults.split(",")))
        finally:
            tb.down(quiet=True)
        return
    tb.up(timeout=90, slurm="host")  # the bench runs clusterctl with this Python on the hosts
    work = Path("/tmp/clusterctl-recovery-bench")
    subprocess.run(["rm", "-rf", str(work)], check=True)
    work.mkdir()
    try:
        trials = [trial(tb, work, n, str(LAYOUT.root / "job-health")) for n in range(args.trials)]
    finally:
        tb.down(quiet=True)
    summary = {stage: {"median": round(statistics.median(t[stage] for t in trials), 3),
                       "max": round(max(t[stage] for t in trials), 3)} for stage in (*STAGES, "total")}
    summary["p90_total"] = round(percentile([t["total"] for t in trials], 0.9), 3)
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "recovery.json").write_text(json.dumps({"trials": trials, "summary": summary}, indent=2) + "\n")
    for stage in (*STAGES, "total"):
        print(f"{stage:8s} median {summary[stage]['median']:6.2f} s   max {summary[stage]['max']:6.2f} s")


if __name__ == "__main__":
    main()
