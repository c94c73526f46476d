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
`--faults cut-link` cuts the link of a node of the step that is not the batch host, `kill-node` powers
it off (in-allocation only: a node the job's own witnesses find gone, launcher/pure/reachability.py).
`--recover shrink,no-spare-resubmit` compares a job of 3 nodes without a spare (TP=8, DP=3) that
goes on with one replica fewer inside its allocation (issue 43) against the same job resubmitted.
`--timeouts fast,production` runs every case on the fast testbed and again under Slurm's default
timeouts (300/10/30 s: what a real cluster runs), each in its own file
(recovery_compare.<profile>.json).
Writes bench/results/recovery_compare.json.

    sudo .venv/bin/python bench/recovery_bench.py --compare --checkpoint shared,tiers --state-mb 1024 \
        --shared-mb-per-s 100 --faults xid --queues idle [--trials 5]

The same recovery with the job's checkpoints saved two ways, trials alternating between them (issue #25):
`shared`, today's (rank 0's checkpoint to the shared checkpoint directory, every rank's bulk state
beside it), and `tiers`, the spec's `[checkpoint] tiers = true` (every rank saves through
clusterctl.checkpoint into its node's memory, a copy goes to the buddy node, every
`--flush-every-steps`-th is flushed to the checkpoint directory; a resume takes each node's part from
its own copy, else its buddy's, else shared storage).  `--state-mb` gives each node that much state
(examples/toy_trainer.py `--state-mb`: each rank carries its share and reads it back on a resume);
`--shared-mb-per-s` is shared storage's bandwidth per node, what bench/throttled_storage.py emulates
for DCP: the toy trainer paces its reads and writes of the shared checkpoint directory to it (split
among a node's ranks), and the tiers' flush is throttled to it (`shared_mb_per_s`).  The fault comes
once checkpoint 20 is complete: on shared storage (`shared`), or in every node's tier and on its buddy
(`tiers`: the nodes' holdings say so).  Per trial also the slowest node's staging of its resume copy
(the Checkpointer's line in the job's log) and rank 0's whole read of its state.  The testbed's nodes
share this machine's /dev/shm, disk and 2 cores: each node's tier holds up to `keep` (2) own and 2
buddy copies, so `tiers` needs about 5 x --state-mb of memory per node; every copy of a trial is
removed after it.  A line per case compares the two (median fault → stepping, and the ratio).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
import json
import math
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from stats import percentile  # noqa: E402

from clusterctl.launcher.job.checkpoint_plan import run_key  # noqa: E402
from clusterctl.records.checkpoint_holdings import CheckpointHoldings, read_holdings  # noqa: E402
from clusterctl.records.rank_map import rank_map_path, read_rank_map  # noqa: E402
from clusterctl.records.run_journal import read_run_journal  # noqa: E402
from clusterctl.slurm import hostlist  # noqa: E402
from clusterctl_testbed.cluster import Testbed  # noqa: E402
from clusterctl_testbed.gpu_faults import Fault, inject  # noqa: E402
from clusterctl_testbed.layout import Layout  # noqa: E402
from clusterctl_testbed.slurm_config import TIMEOUTS  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
LAYOUT = Layout(root=Path("/tmp/ctb-recovery"), namespace_prefix="ctbr-")
FAULTS = ("xid", "kill-batch-host", "cut-link", "kill-node")
RECOVERS = ("in-allocation", "resubmit")
"""The ways `--compare` runs by default: a job of 2 nodes with a spare, recovered on it or through the queue."""
NO_SPARE_RECOVERS = ("shrink", "no-spare-resubmit")
"""Asked for by name (`--recover shrink,no-spare-resubmit`): a job of 3 nodes, no spare, TP=8 and DP=3, that
goes on with one replica fewer inside its allocation (`restart.min_data_parallel = 2`, issue 43), or may not
shrink and is resubmitted (`min_data_parallel = 3`): on a busy queue that waits for a node to be freed."""
SLURM_NOTICES = 0.0
"""Extra seconds a recovery may wait for Slurm to declare a node DOWN (420 under the production timeouts)."""
STAGES = ("detect", "job end", "submit", "start", "resume", "step")
SPEC = """\
[job]
name = "recovery-bench"
nodes = 3
[launch]
command = ["{python}", "toy_trainer.py", "--checkpoint-dir", "{{checkpoint_dir}}", "--steps", "2000",
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


def journal_job(run: Path) -> str | None:
    """The Slurm job of the run's newest attempt, once the supervisor journaled its submission."""
    submitted = _events(run).get("submitted", [])
    return submitted[-1].job_id if submitted else None


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
    spec.write_text(SPEC.format(examples=REPO / "examples", python=sys.executable))
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
        # Every node in service, and healthd must have seen the healed GPU: otherwise it drains the node again
        # as the next trial's job starts there (seen: a trial whose first attempt was cancelled at once).
        tb.back_in_service(faulted="node" in locals())


COMPARE_SPEC = """\
[job]
name = "recovery-compare"
nodes = 2
spare_nodes = 1
sbatch_options = ["--exclusive"]
[launch]
command = ["{python}", "toy_trainer.py", "--checkpoint-dir", "{{checkpoint_dir}}", "--steps", "2000",
           "--checkpoint-every", "10", "--step-time", "0.1", "--log-every", "1", "--peer-timeout", "{peer_timeout}"{state}]
workdir = "{examples}"
[parallel]
tp = 8
pp = 2
[checkpoint]
dir = "{{run_dir}}/checkpoints"
{checkpoint}
[restart]
poll_seconds = 0.5
recover = "{recover}"
"""
CHECKPOINTS = ("shared", "tiers")
"""How the compared job saves: today's way (to the shared checkpoint directory), or `[checkpoint] tiers = true`."""
FAULT_AT_STEP = 20
QUEUES = ("busy", "idle")


def save_seconds(state_mb: float, shared_mb_per_s: float) -> float:
    """About how long one synchronous save (or read) of a node's state to shared storage takes."""
    return state_mb / shared_mb_per_s if state_mb > 0 and shared_mb_per_s > 0 else 0.0


def compare_spec(examples: Path, recover: str, checkpoint: str, *, state_mb: float = 0.0,
                 shared_mb_per_s: float = 0.0, flush_every_steps: int = 40) -> str:
    """The compared job's spec: the toy trainer with `state_mb` MB of state per node, saved `checkpoint`'s
    way, recovered `recover`'s way.  A rank gives up on a silent peer after 15 s, or three of its
    synchronous saves when those are longer (every rank waits for the slowest one's save)."""
    if checkpoint not in CHECKPOINTS:
        raise ValueError(f"checkpoint {checkpoint!r}: one of {', '.join(CHECKPOINTS)}")
    peer_timeout = max(15, math.ceil(3 * save_seconds(state_mb, shared_mb_per_s)) + 10)
    state = ""
    if state_mb > 0:
        state = f', "--state-mb", "{state_mb:g}"'
        if shared_mb_per_s > 0 and checkpoint == "shared":
            state += f', "--shared-mb-per-s", "{shared_mb_per_s:g}"'
    if checkpoint == "tiers":
        keys = f"tiers = true\nkeep = 2\nflush_every_steps = {flush_every_steps}"
        if shared_mb_per_s > 0:
            keys += f"\nshared_mb_per_s = {shared_mb_per_s:g}"
    else:
        keys = 'validator = "manifest"\nresume_args = ["--resume", "{path}"]'
    # The trainer runs with this Python (clusterctl importable): its Checkpointer and beat() are clusterctl's.
    text = COMPARE_SPEC.format(examples=examples, recover="in-allocation" if recover in NO_SPARE_RECOVERS else recover,
                               peer_timeout=peer_timeout, state=state, checkpoint=keys, python=sys.executable)
    if recover in NO_SPARE_RECOVERS:
        floor = 2 if recover == "shrink" else 3
        text = text.replace("nodes = 2\nspare_nodes = 1", "nodes = 3").replace("pp = 2", "pp = 1")
        text += f"min_data_parallel = {floor}\n"
    return text


def replicated_step(holdings: Iterable[CheckpointHoldings], nodes: Sequence[str]) -> int | None:
    """The newest step every one of `nodes` holds in its own tier and has on its buddy (the nodes'
    holdings.json, as their reporters send them to the agent): what a resume on a spare can use."""
    copies = [c for held in holdings for c in held.copies]
    local = {(c.step, c.of_node) for c in copies if c.tier == "local"}
    buddy = {(c.step, c.of_node) for c in copies if c.tier == "buddy"}
    whole = [step for step in {s for s, _ in local} if all((step, n) in local and (step, n) in buddy for n in nodes)]
    return max(whole, default=None)


_STAGED = re.compile(r"resuming step (\d+) on (\S+): slot \d+'s files from (.+?) in ([\d.]+) s$", re.M)
_READ = re.compile(r"rank 0\] resumed .*?bulk state with it, in ([\d.]+) s\)", re.M)


def resume_reads(log_text: str) -> dict[str, float | str]:
    """From a job's log: the slowest node's staging of its resume copy (the Checkpointer's line on each
    node: `staged_s`, and where it came from) and rank 0's read of its whole state (`read_s`, the toy
    trainer's line with --state-mb); what the log does not say is left out."""
    found: dict[str, float | str] = {}
    staged = [(float(m.group(4)), m.group(3), m.group(2)) for m in _STAGED.finditer(log_text)]
    if staged:
        seconds, source, node = max(staged)
        found |= {"staged_s": seconds, "staged_from": f"{source} (on {node})"}
    if (read := _READ.search(log_text)):
        found["read_s"] = float(read.group(1))
    return found


def side_by_side(summary: Mapping[str, Mapping[str, Mapping[str, float]]]) -> list[str]:
    """One line per case measured both ways: median fault → stepping with shared and with tiers, and the ratio."""
    lines = []
    for label, figures in summary.items():
        if not label.endswith(", shared") or "total" not in figures:
            continue
        case = label.removesuffix(", shared")
        tiers = summary.get(f"{case}, tiers", {}).get("total")
        if tiers is None:
            continue
        shared = figures["total"]["median"]
        lines.append(f"{case}: fault → stepping again {shared:.2f} s with shared storage, {tiers['median']:.2f} s "
                     f"with tiers ({shared / tiers['median']:.1f}x)")
    return lines


def _tier_roots(run: Path) -> list[Path]:
    """The run's node tiers on this machine (the testbed's nodes share its /dev/shm)."""
    return sorted(Path("/dev/shm").glob(f"clusterctl-*/ckpt-{run_key(run)}"))


def _replicated(run: Path, nodes: Sequence[str]) -> int | None:
    held = []
    for root in _tier_roots(run):
        for node in nodes:
            try:
                if (one := read_holdings(root / node / "holdings.json")) is not None:
                    held.append(one)
            except (OSError, ValueError):
                continue
    return replicated_step(held, nodes)


def compare_trial(tb: Testbed, work: Path, label: str, recover: str, busy: bool, number: int, records: str,
                  busy_seconds: int, fault: str = "xid", checkpoint: str = "shared", state_mb: float = 0.0,
                  shared_mb_per_s: float = 0.0, flush_every_steps: int = 40) -> dict[str, float | str]:
    """One fault, one way of recovering: seconds from the injection to rank 0 stepping again.  `fault`:
    Xid 79 on a GPU of the second node of the map, or `kill-batch-host` (the allocation's first node,
    where the agent and rank 0 run, powered off: its standby on the spare takes the job over).
    `checkpoint`: how the job saves (CHECKPOINTS), with `state_mb` of state per node."""
    run = work / f"{label}-{number}"
    spec = work / f"{label}-{number}.toml"
    spec.write_text(compare_spec(REPO / "examples", recover, checkpoint, state_mb=state_mb,
                                 shared_mb_per_s=shared_mb_per_s, flush_every_steps=flush_every_steps))
    slow = 4 * save_seconds(state_mb, shared_mb_per_s)  # a synchronous save or read of the state, with room
    cli = [*tb.enter("ctl", cwd=str(REPO)), sys.executable, "-c", "from clusterctl.launcher.login.cli import main; main()"]
    supervisor = subprocess.Popen([*cli, "submit", str(spec), "--run-dir", str(run), "--supervise",
                                   "--job-records", records], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        _wait(lambda: journal_job(run), 90, "the submission")
        job = journal_job(run)
        _wait(lambda: rank_map_path(run / "jobs" / job).exists(), 90, "the rank map")
        if checkpoint == "tiers":
            nodes = list(read_rank_map(run / "jobs" / job).slots)
            _wait(lambda: (_replicated(run, nodes) or 0) >= FAULT_AT_STEP, 90 + slow,
                  f"checkpoint {FAULT_AT_STEP} in every node's tier and on its buddy")
        else:
            _wait(lambda: (run / "checkpoints" / f"step-{FAULT_AT_STEP:08d}").exists(), 90 + 3 * slow,
                  f"the step-{FAULT_AT_STEP} checkpoint")
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
        elif fault in ("cut-link", "kill-node"):  # a node of the step that is not the batch host
            batch_host = hostlist.expand(rank_map.nodelist)[0]
            node = next(n for n in rank_map.slots if n != batch_host)
            injected = time.time()
            (tb.cut_link if fault == "cut-link" else tb.kill_node)(node)
        else:
            # Not the batch host (where the agent runs): its loss ends the job for the supervisor in every way.
            batch_host = hostlist.expand(rank_map.nodelist)[0]
            node = next(n for n in rank_map.slots[1:] if n != batch_host)
            injected = time.time()
            inject(tb.nvml_dir(node), Fault("xid", gpu=number % 8, value=79))
        if recover in ("in-allocation", "shrink"):
            event = _wait(lambda: _events(run).get("recovered-in-allocation", [None])[-1], 120 + SLURM_NOTICES,
                          "the restart")
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
        resumed = _wait(lambda: seen(r"rank 0\] resumed "), busy_seconds + 120 + slow, "the resume")
        stepped = _wait(lambda: seen(r"rank 0\] step \d+ took"), 60 + slow, "a step after the resume")
        result: dict[str, float | str] = {"node": node, "resumed": round(resumed - injected, 3),
                                          "total": round(stepped - injected, 3)}
        result |= resume_reads(log.read_text(errors="replace")[before:])
        if recover in ("in-allocation", "shrink"):
            phases = dict(event.phases)
            result |= {"step ended": round(event.at - sum(phases.values()) - injected + phases["end_step"], 3),
                       **{k: v for k, v in phases.items() if k != "end_step"}}
        return result
    finally:
        subprocess.run([*cli, "cancel", str(run)], capture_output=True)
        supervisor.wait(timeout=60)
        tb.run_on("ctl", ["scancel", "-n", "filler,waiting"], check=False)
        # Each trial's copies go: the nodes' tiers are this machine's memory, the state on its disk.
        for root in _tier_roots(run):
            shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(run / "checkpoints", ignore_errors=True)
        if "node" in locals() and fault in ("kill-batch-host", "kill-node"):
            tb.boot_node(node)
        elif "node" in locals() and fault == "cut-link":
            tb.heal_link(node)
            tb.restart_slurmd(node)  # registers now: under the production timeouts the next ping is ≤ 100 s away
        elif "node" in locals():
            inject(tb.nvml_dir(node), Fault("clear"))
        # The next trial must find every node in service, and healthd must have seen the healed GPU:
        # otherwise it drains the spare again as that trial runs (seen: recovery fell back to the queue).
        tb.back_in_service(faulted="node" in locals())


def compare_cases(faults: Sequence[str], queues: Sequence[str], checkpoints: Sequence[str],
                  recovers: Sequence[str] = RECOVERS) -> list[tuple[str, str, bool, str, str]]:
    """(label, recover, busy, fault, checkpoint) of every case asked for, in the order they run; a case's
    checkpoint ways follow each other (their trials alternate: see compare)."""
    cases = [(label, recover, busy, "xid") for label, recover, busy in (
        ("in-allocation, busy queue", "in-allocation", True), ("resubmission, busy queue", "resubmit", True),
        ("in-allocation, idle queue", "in-allocation", False), ("resubmission, idle queue", "resubmit", False))]
    cases += [(f"batch host killed, {how}, {label}", recover, busy, "kill-batch-host")
              for label, busy in (("busy queue", True), ("idle queue", False))
              for how, recover in (("in-allocation", "in-allocation"), ("resubmission", "resubmit"))]
    cases += [(f"{what}, in-allocation, {label}", "in-allocation", busy, fault)
              for fault, what in (("cut-link", "a node's link cut"), ("kill-node", "a node powered off"))
              for label, busy in (("busy queue", True), ("idle queue", False))]
    cases += [(f"no spare, {how}, {label}", recover, busy, "xid")
              for label, busy in (("busy queue", True), ("idle queue", False))
              for how, recover in (("shrink", "shrink"), ("resubmission", "no-spare-resubmit"))]
    chosen = []
    for label, recover, busy, fault in cases:
        if fault not in faults or ("busy" if busy else "idle") not in queues or recover not in recovers:
            continue
        for checkpoint in checkpoints:
            # Today's way alone keeps the labels earlier results were written with.
            named = label if tuple(checkpoints) == ("shared",) else f"{label}, {checkpoint}"
            chosen.append((named, recover, busy, fault, checkpoint))
    return chosen


def summarize(results: Mapping[str, Sequence[Mapping[str, float | str]]]) -> dict[str, dict[str, dict[str, float]]]:
    """Median, min and max of every number each case's trials measured."""
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for label, rows in results.items():
        keys = [k for k in rows[0] if all(isinstance(r.get(k), (int, float)) for r in rows)] if rows else []
        summary[label] = {key: {"median": round(statistics.median(float(r[key]) for r in rows), 3),
                                "min": round(min(float(r[key]) for r in rows), 3),
                                "max": round(max(float(r[key]) for r in rows), 3)} for key in keys}
    return summary


def compare(tb: Testbed, trials: int, busy_seconds: int, faults: tuple[str, ...] = ("xid", "kill-batch-host"),
            queues: tuple[str, ...] = QUEUES, checkpoints: tuple[str, ...] = ("shared",), state_mb: float = 0.0,
            shared_mb_per_s: float = 0.0, flush_every_steps: int = 40, out: Path | None = None,
            recovers: tuple[str, ...] = RECOVERS) -> None:
    work = Path("/tmp/clusterctl-recovery-compare")
    subprocess.run(["rm", "-rf", str(work)], check=True)
    work.mkdir()
    records = str(LAYOUT.root / "job-health")
    results: dict[str, list[dict[str, float | str]]] = {}
    cases = compare_cases(faults, queues, checkpoints, recovers)
    groups: dict[tuple[str, str, bool, str], list[tuple[str, str]]] = {}
    for label, recover, busy, fault, checkpoint in cases:
        groups.setdefault((label.removesuffix(f", {checkpoint}"), recover, busy, fault), []).append((label, checkpoint))
    for (_, recover, busy, fault), ways in groups.items():
        for number in range(trials):  # the ways alternate, so a machine that gets busier slows both alike
            for label, checkpoint in ways:
                slug = label.replace(", ", "-").replace(" ", "-")
                results.setdefault(label, []).append(compare_trial(
                    tb, work, slug, recover, busy, number, records, busy_seconds, fault, checkpoint, state_mb,
                    shared_mb_per_s, flush_every_steps))
                _write_compare(out, results, busy_seconds, checkpoints, state_mb, shared_mb_per_s, flush_every_steps)
        for label, _ in ways:
            totals = [float(t["total"]) for t in results[label]]
            print(f"{label:36s} fault → stepping again: median {statistics.median(totals):6.2f} s "
                  f"[{min(totals):.2f}–{max(totals):.2f}] over {len(totals)}", flush=True)
    for line in side_by_side(summarize(results)):
        print(line, flush=True)
    _write_compare(out, results, busy_seconds, checkpoints, state_mb, shared_mb_per_s, flush_every_steps)


def _write_compare(out: Path | None, results: Mapping[str, Sequence[Mapping[str, float | str]]], busy_seconds: int,
                   checkpoints: Sequence[str], state_mb: float, shared_mb_per_s: float, flush_every_steps: int) -> None:
    """The comparison's trials so far and their summary, as JSON (rewritten after every trial: a run that
    stops keeps what it measured)."""
    summary = summarize(results)
    out = out or REPO / "bench" / "results" / "recovery_compare.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"busy_seconds": busy_seconds, "checkpoints": list(checkpoints), "state_mb": state_mb,
                               "shared_mb_per_s": shared_mb_per_s, "flush_every_steps": flush_every_steps,
                               "trials": results, "summary": summary, "side_by_side": side_by_side(summary)},
                              indent=2) + "\n")


def _choices(text: str, allowed: Sequence[str], option: str, parser: argparse.ArgumentParser) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    wrong = [c for c in chosen if c not in allowed]
    if wrong or not chosen:
        parser.error(f"{option} {text!r}: a comma-separated list of {', '.join(allowed)}")
    return chosen


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; a usage error (exit 2) naming the option for anything wrong."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--timeouts", default="fast",
                        help="the testbed's Slurm timeouts, comma-separated: fast (5/2/5 s) and/or production "
                             "(Slurm's defaults 300/10/30 s); each profile runs every case on a testbed of its own")
    parser.add_argument("--compare", action="store_true", help="in-allocation against resubmission, idle and busy")
    parser.add_argument("--busy-seconds", type=int, default=45, help="how long the busy queue's jobs run")
    parser.add_argument("--faults", default="xid,kill-batch-host",
                        help="with --compare: xid (a GPU of the second node), kill-batch-host (the node running "
                             "the agent and rank 0, powered off), or both, comma-separated")
    parser.add_argument("--queues", default="busy,idle", help="with --compare: busy, idle or both, comma-separated")
    parser.add_argument("--recover", default=",".join(RECOVERS),
                        help="with --compare: the ways compared, comma-separated: in-allocation, resubmit (a job "
                             "with a spare; the default), shrink, no-spare-resubmit (a job of 3 nodes without one)")
    parser.add_argument("--checkpoint", default="shared",
                        help="with --compare: how the job saves, shared (today's: the shared checkpoint directory), "
                             "tiers ([checkpoint] tiers = true) or both, comma-separated (trials alternate)")
    parser.add_argument("--state-mb", type=float, default=0.0,
                        help="with --compare: MB of state per node (the toy trainer's --state-mb; default 0: its "
                             "own 64 numbers only)")
    parser.add_argument("--shared-mb-per-s", type=float, default=0.0,
                        help="with --compare: shared storage's bandwidth per node, MB/s, for the shared saves and "
                             "reads and the tiers' flush (default 0: no limit)")
    parser.add_argument("--flush-every-steps", type=int, default=40,
                        help="with --checkpoint tiers: every this many steps' checkpoint is flushed (default 40)")
    parser.add_argument("--out", type=Path, default=None,
                        help="with --compare: the results file (default bench/results/recovery_compare.json)")
    args = parser.parse_args(argv)
    args.faults = _choices(args.faults, FAULTS, "--faults", parser)
    args.timeouts = _choices(args.timeouts, tuple(TIMEOUTS), "--timeouts", parser)
    args.queues = _choices(args.queues, QUEUES, "--queues", parser)
    args.checkpoint = _choices(args.checkpoint, CHECKPOINTS, "--checkpoint", parser)
    args.recover = _choices(args.recover, RECOVERS + NO_SPARE_RECOVERS, "--recover", parser)
    if args.trials < 1 or args.state_mb < 0 or args.shared_mb_per_s < 0 or args.flush_every_steps < 0:
        parser.error("--trials must be at least 1; --state-mb, --shared-mb-per-s and --flush-every-steps "
                     "must not be negative")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    tb = Testbed(LAYOUT)
    if args.compare:
        global SLURM_NOTICES
        for profile in args.timeouts:
            tb = Testbed(replace(LAYOUT, timeouts=profile))
            SLURM_NOTICES = 0.0 if profile == "fast" else 420.0
            tb.down(quiet=True)
            tb.up(timeout=90, slurm="host")
            out = args.out if len(args.timeouts) == 1 else (args.out or REPO / "bench" / "results" /
                                                             "recovery_compare.json").with_suffix(f".{profile}.json")
            try:
                compare(tb, args.trials, args.busy_seconds, args.faults, args.queues, args.checkpoint, args.state_mb,
                        args.shared_mb_per_s, args.flush_every_steps, out, args.recover)
            finally:
                tb.down(quiet=True)
        return
    for profile in args.timeouts:  # each profile on a testbed of its own, its results in a file of its own
        tb = Testbed(replace(LAYOUT, timeouts=profile))
        tb.down(quiet=True)
        tb.up(timeout=90, slurm="host")  # the bench runs clusterctl with this Python on the hosts
        work = Path("/tmp/clusterctl-recovery-bench")
        subprocess.run(["rm", "-rf", str(work)], check=True)
        work.mkdir()
        try:
            trials = [trial(tb, work, n, str(LAYOUT.root / "job-health")) for n in range(args.trials)]
        finally:
            tb.down(quiet=True)
        summary = {stage: {"median": round(statistics.median(t[stage] for t in trials), 3),
                           "min": round(min(t[stage] for t in trials), 3),
                           "max": round(max(t[stage] for t in trials), 3)} for stage in (*STAGES, "total")}
        summary["p90_total"] = round(percentile([t["total"] for t in trials], 0.9), 3)
        out = REPO / "bench" / "results"
        out.mkdir(parents=True, exist_ok=True)
        name = "recovery.json" if args.timeouts == ("fast",) else f"recovery.{profile}.json"
        (out / name).write_text(json.dumps({"timeouts": profile, "trials": trials, "summary": summary}, indent=2)
                                + "\n")
        print(f"Slurm timeouts: {profile}")
        for stage in (*STAGES, "total"):
            print(f"{stage:8s} median {summary[stage]['median']:6.2f} s   "
                  f"[{summary[stage]['min']:.2f}–{summary[stage]['max']:.2f}]")


if __name__ == "__main__":
    main()
