"""clusterctl side by side with the tools users would pick instead (issue #42): the same program, the same faults.

    .venv/bin/python bench/peers_bench.py --local [--trials 5] [--peers-python .venv-peers/bin/python]

Tools: NVIDIA's ft_launcher (nvidia-resiliency-ext, examples/peers/nvrx_trainer.py), torchft (a lighthouse
and one replica group per node, examples/peers/torchft_trainer.py), Slurm's own requeue (the plain
examples/torch_trainer.py under examples/peers/requeue.sbatch) and clusterctl (bench/recovery_bench.py's
trials).  Each peer at its defaults and at the most aggressive timeouts its docs allow (both rows; each
adapter's docstring cites the doc followed and its defaults).  Faults, injected the same way for all:

  xid        an Xid 79 on GPU 0 of the second node, written to the node's emulated NVML (testbed only);
             healthd drains the node for clusterctl.  A peer that does not read healthd learns it the
             way it would from real hardware: CUDA fails in the ranks on that GPU.  The emulated driver
             gives no CUDA, so the program does it itself: every step each rank asks NVML about its GPU
             (toy_trainer.Gpu) and exits with an error (exit 3, "CUDA error") once the GPU is lost.
  power-off  the second node's every process killed at once (the testbed: Testbed.kill_node).
  hang       one rank of the second node stopped (SIGSTOP): alive, silent.
  kill       one rank of the second node killed (SIGKILL).
  straggler  the second node's ranks 1.5x slower (SIGSTOP/SIGCONT: a third of each 0.3 s stopped).

Measured per trial from outside the tools (bench/peer_steps.py): the program's step log (one line per step
per rank, wall clock), the fault's wall time, and every line the tools print, stamped as it arrives: fault
→ detected (the tool's own detection line, else the first sign of a restart), fault → stepping again,
steps lost.  Trials are interleaved across tools and faults (each round runs every case once, in a rotated
order), so machine noise falls on all alike.  A case a tool does not handle, or that cannot run here, is
a row that says so.

The side effects (start a launcher on a node, find its ranks, inject a fault, stop everything) sit behind
one door, `Nodes`: `LocalNodes` (--local) runs each pretend node as its own process tree on this machine,
talking over loopback (no Slurm: the peers' own launchers only), which validates every adapter end to end;
`TestbedNodes` starts them inside the testbed's nodes and injects faults with the testbed's APIs
(Testbed.kill_node, gpu_faults.inject).  Writes bench/results/peers_local.json (--local) or peers.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_steps import measure_trial, parse_step_log, first_match, table  # noqa: E402

from clusterctl_testbed.system import kill_all, power_off  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
FAULTS = ("xid", "power-off", "hang", "kill", "straggler")
TOOLS = ("nvrx", "torchft", "slurm-requeue", "clusterctl")
TIMEOUTS = ("defaults", "aggressive")
FAULT_STEP = 25
"""The fault comes once a rank finished this step: 5 steps after checkpoint 20 (--checkpoint-every 10)."""
TRAINER_ARGS = ("--steps", "100000", "--step-time", "0.1", "--checkpoint-every", "10", "--log-every", "10")
RANKS_PER_NODE = 2
STRAGGLE_PERIOD, STRAGGLE_STOPPED = 0.3, 0.1  # run 0.2 s, stopped 0.1 s: 1.5x the time per step


class NotAvailable(Exception):
    """This fault or tool cannot run on these nodes (the reason becomes the row's note)."""


# ---- what each tool runs: pure ------------------------------------------------------------------
@dataclass(frozen=True)
class Launch:
    """One process to start on one node: argv and the environment it adds."""

    node: int
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """Everything a trial of one tool starts: services (torchft's lighthouse) first, then a launcher per node."""

    services: tuple[Launch, ...]
    launchers: tuple[Launch, ...]
    rank_marker: str
    """A word in every training rank's command line (the adapter's file name)."""


DETECTION = {
    # ft_launcher: a rank monitor's missed heartbeat, its in-job restarter "handling", a failed worker group.
    "nvrx": re.compile(r"NestedRestarter\] name=\[InJob\] state=handling stage=starting|failed \(exitcode|"
                       r"Worker group FAILED|Did not get (initial )?heartbeat|FT timeout elapsed"),
    # torchft: a surviving group's manager reconfiguring for a new quorum without the lost group.
    "torchft": re.compile(r"reconfiguring for quorum_id"),
}
"""Each tool's own words for "I saw the failure" (slurm-requeue has none: its first restart sign counts)."""

NOT_HANDLED = {
    ("nvrx", "straggler"): "not handled (its docs; not measured): ft_launcher acts on a rank that stops or dies; "
                           "NVRx's straggler detection is a separate in-process API that reports scores",
    ("torchft", "straggler"): "not handled (its docs; not measured): a slow replica group slows every step's "
                              "quorum; nothing evicts it",
    ("slurm-requeue", "straggler"): "not handled (not measured): Slurm sees a running job",
    ("slurm-requeue", "hang"): "not handled by Slurm (not measured): it requeues a job that ends; a silent rank "
                               "ends it only when the program's own collective timeout (torch_trainer --timeout) fires",
}


def nvrx_timeouts(which: str) -> tuple[str, ...]:
    """ft_launcher's options: none at the defaults (3600 s / 2700 s heartbeat timeouts); the aggressive row sets
    them from this program's step (0.1 s, heartbeats not sent during a checkpoint save): 5 s, and a 1 s check."""
    if which == "defaults":
        return ()
    return ("--ft-initial-rank-heartbeat-timeout=120", "--ft-rank-heartbeat-timeout=5",
            "--ft-workload-check-interval=1", "--monitor-interval=1")


def torchft_timeouts(which: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """(lighthouse options, manager environment): the Slurm example's lighthouse (torchft/examples/slurm/README.md)
    and the Manager's defaults; aggressive: a replica declared dead after 1 s without a heartbeat (10 of its
    100 ms heartbeats; the docs give no lower bound) and collectives given up after 10 s."""
    lighthouse = ("--min_replicas", "1", "--quorum_tick_ms", "100", "--join_timeout_ms", "10000")
    if which == "defaults":
        return lighthouse, {}
    return (*lighthouse, "--heartbeat_timeout_ms", "1000"), {"TORCHFT_TIMEOUT_SEC": "10"}


def plan(tool: str, which: str, *, nodes: int, bindir: Path, work: Path, address: str, port: int) -> Plan:
    """What a trial of `tool` at `which` timeouts starts on `nodes` nodes (ports from `port` up)."""
    trainer = ("--checkpoint-dir", str(work / "checkpoints"), "--step-log", str(work / "steps.log"), *TRAINER_ARGS)
    if tool == "nvrx":
        script = EXAMPLES / "peers" / "nvrx_trainer.py"
        argv = (str(bindir / "ft_launcher"), f"--nnodes={nodes}", f"--nproc-per-node={RANKS_PER_NODE}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={address}:{port}", f"--rdzv-id={work.name}",
                "--max-restarts=3", *nvrx_timeouts(which), str(script), *trainer)
        return Plan((), tuple(Launch(n, argv) for n in range(nodes)), script.name)
    if tool == "torchft":
        script = EXAMPLES / "peers" / "torchft_trainer.py"
        lighthouse, env = torchft_timeouts(which)
        service = Launch(0, (str(bindir / "torchft_lighthouse"), *lighthouse, "--bind", f"{address}:{port}"))
        launchers = tuple(
            Launch(n, (str(bindir / "torchrun"), f"--nproc-per-node={RANKS_PER_NODE}", "--max-restarts=3",
                       f"--master-addr={address}", f"--master-port={port + 1 + n}", str(script), *trainer),
                   {**env, "TORCHFT_LIGHTHOUSE": f"http://{address}:{port}", "REPLICA_GROUP_ID": str(n),
                    "NUM_REPLICA_GROUPS": str(nodes)})
            for n in range(nodes))
        return Plan((service,), launchers, script.name)
    raise NotAvailable(f"{tool} runs under Slurm only (bench/recovery_bench.py and examples/peers/requeue.sbatch "
                       "on the testbed)")


# ---- the door to the nodes ----------------------------------------------------------------------
class Nodes(Protocol):
    """Where a trial's processes run and its faults land."""

    def start(self, launch: Launch, log: Path) -> None:
        """Start `launch` on its node; every line it prints goes to `log` and to stamped()."""

    def stamped(self) -> list[tuple[float, str]]:
        """Every line the started processes printed so far, each with the wall time it arrived."""

    def rank_pids(self, node: int, marker: str) -> list[int]:
        """The training ranks running on `node` now (their command line has `marker`), by local rank."""

    def inject(self, fault: str, node: int, marker: str) -> float:
        """Inject `fault` on `node`; the wall time it struck (after finding its targets: that takes a while).
        Raises NotAvailable when these nodes cannot."""

    def stop(self) -> None:
        """End every process started (and any fault still acting)."""


class LocalNodes:
    """Pretend nodes on this machine: each launch its own session (process tree), over loopback, niced."""

    def __init__(self) -> None:
        self._procs: list[tuple[int, subprocess.Popen[bytes]]] = []
        self._lines: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._stop_straggling = threading.Event()

    def start(self, launch: Launch, log: Path) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **launch.env}
        proc = subprocess.Popen(["nice", "-n", "19", *launch.argv], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self._procs.append((launch.node, proc))
        threading.Thread(target=self._read, args=(proc, log), daemon=True).start()

    def _read(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        assert proc.stdout is not None
        with log.open("a") as out:
            for raw in proc.stdout:
                now, text = time.time(), raw.decode(errors="replace").rstrip("\n")
                out.write(f"{now:.6f} {text}\n")
                with self._lock:
                    self._lines.append((now, text))

    def stamped(self) -> list[tuple[float, str]]:
        with self._lock:
            return list(self._lines)

    def _tree(self, node: int) -> list[psutil.Process]:
        found: list[psutil.Process] = []
        for n, proc in self._procs:
            if n != node:
                continue
            try:
                root = psutil.Process(proc.pid)
                found += [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
        return found

    def rank_pids(self, node: int, marker: str) -> list[int]:
        ranks = []
        for p in self._tree(node):
            try:
                if any(marker in part for part in p.cmdline()) and "LOCAL_RANK" in (env := p.environ()):
                    ranks.append((int(env["LOCAL_RANK"]), p.pid))
            except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
                continue
        return [pid for _, pid in sorted(ranks)]

    def inject(self, fault: str, node: int, marker: str) -> float:
        if fault == "xid":
            raise NotAvailable("not run locally: an Xid needs the testbed's emulated NVML")
        if fault == "power-off":
            tree = [p.pid for p in self._tree(node)]
            struck = time.time()
            _signal_all(tree, signal.SIGKILL)
            power_off(lambda: [p.pid for p in self._tree(node)])  # and whatever forked meanwhile
            return struck
        ranks = self.rank_pids(node, marker)
        if not ranks:
            raise RuntimeError(f"no training rank found on node {node}")
        struck = time.time()
        if fault == "kill":
            os.kill(ranks[-1], signal.SIGKILL)
        elif fault == "hang":
            os.kill(ranks[-1], signal.SIGSTOP)
        elif fault == "straggler":
            threading.Thread(target=self._straggle, args=(node, marker), daemon=True).start()
        else:
            raise ValueError(f"unknown fault {fault!r}")
        return struck

    def _straggle(self, node: int, marker: str) -> None:
        while not self._stop_straggling.wait(STRAGGLE_PERIOD - STRAGGLE_STOPPED):
            ranks = self.rank_pids(node, marker)
            _signal_all(ranks, signal.SIGSTOP)
            time.sleep(STRAGGLE_STOPPED)
            _signal_all(ranks, signal.SIGCONT)

    def stop(self) -> None:
        self._stop_straggling.set()
        pids = sorted({p.pid for node in {n for n, _ in self._procs} for p in self._tree(node)})
        _signal_all(pids, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        kill_all(pids, grace=3.0)
        for _, proc in self._procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()


def _signal_all(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class TestbedNodes(LocalNodes):
    """The testbed's nodes (not run in this slice): each launch entered into its node's namespaces
    (Testbed.enter), a power-off by Testbed.kill_node, an Xid by the testbed's emulated NVML
    (gpu_faults.inject: the node's healthd drains it; the ranks on the GPU fail through toy_trainer.Gpu)."""

    __test__ = False  # not a pytest class

    def __init__(self, testbed, hosts: Sequence[str]) -> None:
        super().__init__()
        self.testbed, self.hosts = testbed, list(hosts)

    def start(self, launch: Launch, log: Path) -> None:
        host = self.hosts[launch.node]
        entered = Launch(launch.node, (*self.testbed.enter(host, cwd=str(REPO)), *launch.argv), launch.env)
        super().start(entered, log)

    def inject(self, fault: str, node: int, marker: str) -> float:
        from clusterctl_testbed.gpu_faults import Fault, inject

        struck = time.time()
        if fault == "xid":
            inject(self.testbed.nvml_dir(self.hosts[node]), Fault("xid", gpu=0, value=79))
        elif fault == "power-off":
            self.testbed.kill_node(self.hosts[node])
        else:
            return super().inject(fault, node, marker)
        return struck


# ---- one trial ----------------------------------------------------------------------------------
def run_trial(nodes: Nodes, tool: str, which: str, fault: str, *, work: Path, bindir: Path, address: str,
              port: int, node_count: int, timeout: float, clock: Callable[[], float] = time.time) -> dict:
    """Start `tool`, wait for step FAULT_STEP, inject `fault` on the second node, and measure until training
    steps again on every rank of its world (or `timeout` seconds pass)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    steps = work / "steps.log"
    steps.touch()
    the_plan = plan(tool, which, nodes=node_count, bindir=bindir, work=work, address=address, port=port)
    record: dict = {"tool": tool, "timeouts": which, "fault": fault}
    try:
        for launch in (*the_plan.services, *the_plan.launchers):
            nodes.start(launch, work / f"node{launch.node}.log")
            if launch in the_plan.services:
                time.sleep(0.5)
        deadline = clock() + 240
        while max((line.step for line in parse_step_log(steps.read_text())), default=0) < FAULT_STEP:
            if clock() > deadline:
                raise RuntimeError(f"never reached step {FAULT_STEP}: " + _tail(nodes))
            time.sleep(0.1)
        fault_at = nodes.inject(fault, node_count - 1, the_plan.rank_marker)
        record["fault_at"] = fault_at
        deadline = fault_at + timeout
        while clock() < deadline:
            measured = measure_trial(parse_step_log(steps.read_text()), fault_at, None)
            if measured.stepping_again_s is not None:
                time.sleep(1.0)  # the tool's lines about it, and a few more steps
                break
            time.sleep(0.2)
        lines = parse_step_log(steps.read_text())
        detected = first_match(nodes.stamped(), fault_at, DETECTION[tool]) if tool in DETECTION else None
        record.update(asdict(measure_trial(lines, fault_at, detected)))
        # The raw lines around the recovery, relative to the fault, so a later reading can measure again.
        end = fault_at + (record["stepping_again_s"] or timeout) + 1.0
        record["step_lines"] = [[round(line.wall - fault_at, 3), line.step, line.rank, line.world]
                                for line in lines if fault_at - 1.0 <= line.wall <= end]
        record["worlds_after"] = sorted({line.world for line in lines if line.wall > fault_at})
        if record["stepping_again_s"] is None:
            record["note"] = f"not stepping again within {timeout:.0f} s: " + _tail(nodes)
    finally:
        nodes.stop()
    return record


def _tail(nodes: Nodes, count: int = 3) -> str:
    interesting = [text for _, text in nodes.stamped() if re.search(r"error|fail|refused|Traceback|exit", text, re.I)]
    return " | ".join(text.strip()[:200] for text in (interesting or [t for _, t in nodes.stamped()])[-count:])


# ---- the whole run ------------------------------------------------------------------------------
def versions(python: Path) -> dict[str, str]:
    """The peers' package versions, asked of their own interpreter."""
    code = ("import importlib.metadata as m, json, sys; print(json.dumps({'python': sys.version.split()[0], "
            "**{p: m.version(p) for p in ('nvidia-resiliency-ext', 'torchft', 'torch', 'numpy')}}))")
    try:
        done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"{python}: {exc}"}
    return json.loads(done.stdout)


def cases(tools: Sequence[str], faults: Sequence[str], timeouts: Sequence[str], local: bool) -> list[tuple[str, str, str, str]]:
    """Every (tool, timeouts, fault) row, with the reason when it is not run: (tool, timeouts, fault, note)."""
    rows = []
    for fault in faults:
        for tool in tools:
            for which in (("defaults",) if tool in ("clusterctl", "slurm-requeue") else timeouts):
                note = NOT_HANDLED.get((tool, fault), "")
                if not note and local and tool in ("clusterctl", "slurm-requeue"):
                    note = "not run locally: needs Slurm (the testbed)"
                elif not note and local and fault == "xid":
                    note = "not run locally: an Xid needs the testbed's emulated NVML"
                elif not note and local and fault == "power-off" and tool == "nvrx":
                    note = ("not run locally: ft_launcher comes back only with a spare node (an elastic --nnodes "
                            "range), which the local run does not set up")
                elif not note and local and (tool, which, fault) == ("nvrx", "defaults", "hang"):
                    note = "not run locally: at the defaults NVRx finds a hung rank after 2700 s"
                rows.append((tool, which, fault, note))
    return rows


def rotate(items: Sequence, by: int) -> list:
    """`items` started at `by` (mod its length): each round of trials in another order."""
    return [items[(i + by) % len(items)] for i in range(len(items))] if items else []


def merge(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One report from several runs of this bench (each a subset of the cases): every row of the whole matrix,
    with the trials some run measured, else its note; every run's command and versions."""
    if not reports:
        raise ValueError("nothing to merge")
    local = all(report.get("mode") == "local" for report in reports)
    rows: dict[tuple[str, str, str], dict[str, Any]] = {
        (t, w, f): {"tool": t, "timeouts": w, "fault": f, "note": note, "trials": []}
        for t, w, f, note in cases(TOOLS, FAULTS, TIMEOUTS, local)}
    for report in reports:
        for row in report["rows"]:
            key = (row["tool"], row["timeouts"], row["fault"])
            if row.get("trials") and key in rows:
                rows[key]["trials"] += row["trials"]
                rows[key]["note"] = ""
    for row in rows.values():
        if not row["trials"] and not row["note"]:
            row["note"] = "not run in these runs"
    merged = {k: v for k, v in reports[0].items() if k not in ("rows", "command", "versions", "trials")}
    merged.update({"commands": [r.get("command") for r in reports], "versions": [r.get("versions") for r in reports],
                   "rows": list(rows.values())})
    return merged


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--merge", type=Path, nargs="+", metavar="JSON",
                        help="write one report (--out) of earlier runs' JSON files, each a subset of the cases")
    parser.add_argument("--local", action="store_true", help="pretend nodes on this machine (no Slurm)")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--timeouts", default=",".join(TIMEOUTS))
    parser.add_argument("--cases", help="only these tool:timeouts:fault cases (e.g. nvrx:aggressive:kill,...)")
    parser.add_argument("--peers-python", type=Path, default=REPO / ".venv-peers" / "bin" / "python",
                        help="the interpreter with the peers (scripts/setup.sh with CLUSTERCTL_PEERS=1)")
    parser.add_argument("--trial-timeout", type=float, default=120.0, help="seconds a recovery may take")
    parser.add_argument("--work", type=Path, default=Path("/tmp/peers-bench"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a trial's processes stopped on the way out
    if args.merge:
        try:
            merged = merge([json.loads(path.read_text()) for path in args.merge])
        except (OSError, ValueError, KeyError) as exc:
            parser.error(f"--merge: {exc}")
        out = args.out or REPO / "bench" / "results" / "peers_local.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(merged, indent=1) + "\n")
        print("\n".join(table(merged["rows"])))
        return 0
    for option, allowed in (("tools", TOOLS), ("faults", FAULTS), ("timeouts", TIMEOUTS)):
        chosen = [x for x in getattr(args, option).split(",") if x]
        if bad := [x for x in chosen if x not in allowed]:
            parser.error(f"--{option}: unknown {', '.join(bad)}; choose from {', '.join(allowed)}")
        setattr(args, option, chosen)
    if not args.local:
        parser.error("only --local runs in this slice: the testbed rows (TestbedNodes, clusterctl through "
                     "bench/recovery_bench.py, Slurm requeue) are the next one")
    if not (args.peers_python.is_file() and os.access(args.peers_python, os.X_OK)):
        parser.error(f"no peers' interpreter at {args.peers_python}: run CLUSTERCTL_PEERS=1 bash scripts/setup.sh "
                     "or pass --peers-python")
    bindir = args.peers_python.parent
    all_cases = cases(args.tools, args.faults, args.timeouts, args.local)
    results: dict[tuple[str, str, str], dict[str, Any]] = {
        (t, w, f): {"tool": t, "timeouts": w, "fault": f, "note": note, "trials": []} for t, w, f, note in all_cases}
    runnable = [(t, w, f) for t, w, f, note in all_cases if not note]
    if args.cases:
        wanted = {tuple(case.split(":")) for case in args.cases.split(",") if case}
        if unknown := wanted - set(runnable):
            parser.error(f"--cases: not runnable here: {', '.join(':'.join(c) for c in sorted(unknown))}")
        runnable = [case for case in runnable if case in wanted]
        results = {key: row for key, row in results.items() if key in wanted}
    port = 29700
    for number in range(args.trials):
        for tool, which, fault in rotate(runnable, number):
            port += 10
            print(f"trial {number + 1}/{args.trials}: {tool} ({which}), {fault}", file=sys.stderr, flush=True)
            try:
                record = run_trial(LocalNodes(), tool, which, fault, work=args.work / f"{tool}-{which}-{fault}-{number + 1}",
                                   bindir=bindir, address="127.0.0.1", port=port, node_count=2,
                                   timeout=args.trial_timeout)
            except (RuntimeError, NotAvailable, OSError) as exc:
                record = {"tool": tool, "timeouts": which, "fault": fault, "stepping_again_s": None,
                          "note": f"failed: {exc}"}
            print(f"  {json.dumps({k: v for k, v in record.items() if k != 'fault_at'})}", file=sys.stderr, flush=True)
            results[(tool, which, fault)]["trials"].append(record)
    rows = list(results.values())
    report = {"mode": "local" if args.local else "testbed", "nodes": 2, "ranks_per_node": RANKS_PER_NODE,
              "trainer_args": list(TRAINER_ARGS), "fault_step": FAULT_STEP, "trials": args.trials,
              "versions": versions(args.peers_python), "machine": {"cpus": os.cpu_count(), "host": platform.node()},
              "command": "bench/peers_bench.py " + " ".join(sys.argv[1:] if argv is None else argv), "rows": rows}
    out = args.out or REPO / "bench" / "results" / ("peers_local.json" if args.local else "peers.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print("\n".join(table(rows)))
    print(f"versions: {report['versions']}; raw: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
