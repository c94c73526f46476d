"""What clusterctl's daemons cost one shared slurmctld at fleet scale, read from slurmctld's own counters.

    sudo .venv/bin/python bench/fleet_bench.py [--slurm host] [--slurm 26.05] \\
        [--code /tmp/old --code .] [--duration 60] [--intervals 3] [--healthd 2] [--supervisors 1]

Builds a real slurmctld with a 12,500-node table and 50,000 queued held jobs and no slurmd
(clusterctl_testbed.fleet; shared/notes/fleet-scale.md), in private mount/UTS/network
namespaces.  `--slurm host` is this machine's Slurm (22.05); 22.05/24.11/26.05 run the
controller, the clients and the components from the testbed's cached root filesystem of that
release (`clusterctl-testbed up --slurm X` builds it once).

For each `--code` checkout (default: the one this file is in), with that checkout's sources
first on the import path (the root filesystem's or this venv's dependencies behind them):
  healthd     --healthd daemons, dry run, emulated NVML with 8 healthy GPUs, each pretending to
              be one node of the fleet (healthd.toml `node = ...`), at healthd's default interval;
  supervisor  --supervisors runs, each `clusterctl submit` (its job joins the queue: it pends, as
              no node answers) then `clusterctl supervise`, each in a runs directory of its own
              (one user each: no shared reads between them).
Each component runs alone: `sdiag -r` when it starts, `sdiag` after --warmup s (start-up), then
--intervals intervals of --duration/--intervals s each, `sdiag -r` before and `sdiag` after.
Every Slurm command the components run goes through a shim that logs its argv, wall time and
stdout bytes; client memory is each component's own peak RSS (VmHWM) and the peak of its
whole process tree (wait4's ru_maxrss: the largest of it and every child, e.g. `sinfo`).

With --probe, first each single Slurm query a component may use (PROBES) is asked alone, three
times: which RPC types it becomes, the median controller time, bytes and client wall.

Reported per component: controller time per instance per hour (median and min–max over the
intervals), the same scaled to the fleet (healthd: µs per node per second, the issue's budget is
≤ 1; and slurmctld seconds per second for 12,500 nodes; supervisor: ms per poll), calls and
bytes per call by command, peak RSS.  A table on stdout, everything in --out (JSON).  The
machine is shared and small: compare codes within one run, not absolute figures across runs.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import sysconfig
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stats import percentile  # noqa: E402

from clusterctl_testbed import fleet as fleet_mod  # noqa: E402
from clusterctl_testbed import rootfs, versions  # noqa: E402
from clusterctl_testbed.cluster import build_nvml  # noqa: E402
from clusterctl_testbed.fleet import NAMESPACE_MARK, SLURM_COMMANDS, Fleet, FleetShape, RpcStat  # noqa: E402

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parent
SHIM = """#!/bin/sh
# fleet bench: log the call (component, start ns, wall us, stdout bytes, argv), then pass the output on.
out=$(mktemp "{tmp}/shim.XXXXXX")
start=$(date +%s%N)
# pdeathsig: a caller that kills the shim on its timeout kills the command too, as without the shim.
setpriv --pdeathsig KILL {real} "$@" > "$out"
rc=$?
end=$(date +%s%N)
printf '%s\\t%s\\t%s\\t%s\\t%s\\n' "$FLEET_COMPONENT" "$start" "$(( (end - start) / 1000 ))" \\
    "$(stat -c %s "$out")" "{name} $*" >> "{log}"
cat "$out"
rm -f "$out"
exit $rc
"""


def say(message: str) -> None:
    print(f"fleet-bench {time.strftime('%H:%M:%S')}: {message}", file=sys.stderr, flush=True)


# ---- a checkout's code, importable on its own -------------------------------------------------
def code_tree(checkout: Path, dest: Path) -> Path:
    """A directory that imports `clusterctl` from `checkout` alone (for PYTHONPATH).

    The checkout maps its top-level folders into the package (pyproject's package-dir), as an
    editable install does; here that map is a tree of symlinks, so no install is needed.
    """
    project = tomllib.loads((checkout / "pyproject.toml").read_text())
    mapped = project.get("tool", {}).get("setuptools", {}).get("package-dir", {})
    if not mapped:
        return checkout
    package = dest / "clusterctl"
    package.mkdir(parents=True, exist_ok=True)
    for entry in (checkout / "clusterctl").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for name, folder in mapped.items():
        parts = name.split(".")
        if len(parts) == 2 and parts[0] == "clusterctl" and not (package / parts[1]).exists():
            (package / parts[1]).symlink_to(checkout / folder)
    return dest


def entry_point(checkout: Path, script: str) -> list[str]:
    """`python -S -P -c ...` arguments that run the checkout's console script `script`."""
    scripts = tomllib.loads((checkout / "pyproject.toml").read_text())["project"]["scripts"]
    module, func = scripts[script].split(":")
    return ["-S", "-P", "-c", f"import sys; from {module} import {func}; sys.exit({func}())"]


@dataclass(frozen=True)
class Python:
    """The interpreter that runs the components, and the site-packages with their dependencies."""

    executable: str
    site_packages: str


def python_for(root: Path | None) -> Python:
    """This venv's Python, or the root filesystem's project venv (paths as seen inside it)."""
    if root is None:
        return Python(sys.executable, sysconfig.get_paths()["purelib"])
    venv = rootfs.VENV
    found = sorted(glob.glob(str(root / str(venv).lstrip("/") / "lib" / "python3*" / "site-packages")))
    if not found:
        raise SystemExit(f"no venv in {root}{venv}; run `clusterctl-testbed up --slurm ...` once to build it")
    return Python(str(venv / "bin" / "python"), "/" + str(Path(found[-1]).relative_to(root)))


# ---- components -------------------------------------------------------------------------------
@dataclass
class Component:
    """One running healthd or supervisor."""

    name: str
    proc: subprocess.Popen
    own_peak_kb: int = 0
    tree_peak_kb: int = 0
    child_peak_kb: dict[str, int] = field(default_factory=dict)


def vm_hwm_kb(pid: int) -> int:
    """A process's own peak RSS (VmHWM), 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(pid: int) -> list[int]:
    """Every descendant of `pid` (from /proc/<pid>/task/*/children)."""
    found, todo = [], [pid]
    while todo:
        for task in glob.glob(f"/proc/{todo.pop()}/task/*/children"):
            try:
                kids = [int(k) for k in Path(task).read_text().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


class MemoryWatch(threading.Thread):
    """Samples each component's descendants' peak RSS (VmHWM) every 50 ms, by command name."""

    def __init__(self, components: list[Component]) -> None:
        super().__init__(daemon=True)
        self.components, self.done = components, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.05):
            for c in self.components:
                try:
                    own = os.readlink(f"/proc/{c.proc.pid}/exe")
                except OSError:
                    continue
                for pid in children(c.proc.pid):
                    try:
                        name = Path(f"/proc/{pid}/comm").read_text().strip()
                        if os.readlink(f"/proc/{pid}/exe") == own:
                            continue  # forked, not yet exec'd: still shows the parent's pages
                    except OSError:
                        continue
                    c.child_peak_kb[name] = max(c.child_peak_kb.get(name, 0), vm_hwm_kb(pid))


def stop(components: list[Component]) -> None:
    """SIGTERM each component and reap it: its own peak RSS before, its tree's peak from wait4."""
    for c in components:
        c.own_peak_kb = vm_hwm_kb(c.proc.pid)
        c.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 20
    for c in components:
        while True:
            pid, _, usage = os.wait4(c.proc.pid, os.WNOHANG)
            if pid:
                c.tree_peak_kb = usage.ru_maxrss
                c.proc.returncode = 0
                break
            if time.monotonic() > deadline:
                c.proc.kill()
            time.sleep(0.05)


# ---- measuring ---------------------------------------------------------------------------------
def controller_us(stats: dict[str, RpcStat]) -> tuple[int, int, dict[str, dict[str, int]]]:
    """(calls, total µs, per type) without sdiag's own REQUEST_STATS_INFO."""
    mine = {k: v for k, v in stats.items() if k != "REQUEST_STATS_INFO"}
    return (sum(v.count for v in mine.values()), sum(v.total_us for v in mine.values()),
            {k: {"count": v.count, "total_us": v.total_us} for k, v in sorted(mine.items())})


def read_shim_log(path: Path, prefix: str, since_ns: int, until_ns: int) -> list[dict]:
    """The logged Slurm calls of components whose name starts with `prefix`, within [since, until)."""
    calls = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return calls
    for line in lines:
        parts = line.split("\t", 4)
        if len(parts) != 5 or not parts[0].startswith(prefix):
            continue
        start = int(parts[1])
        if since_ns <= start < until_ns:
            calls.append({"component": parts[0], "wall_us": int(parts[2]), "bytes": int(parts[3]),
                          "argv": parts[4]})
    return calls


def call_summary(calls: list[dict]) -> dict[str, dict]:
    """Calls grouped by command and first option (e.g. `sinfo --json`): count, median bytes and wall."""
    groups: dict[str, list[dict]] = {}
    for call in calls:
        words = call["argv"].split()
        key = " ".join(words[:2]) if len(words) > 1 else words[0]
        groups.setdefault(key, []).append(call)
    return {key: {"count": len(group), "median_bytes": int(statistics.median(c["bytes"] for c in group)),
                  "median_wall_ms": round(statistics.median(c["wall_us"] for c in group) / 1000, 1)}
            for key, group in sorted(groups.items())}


def measure(fleet: Fleet, components: list[Component], prefix: str, shim_log: Path, args: argparse.Namespace,
            started_ns: int) -> dict:
    """Start-up until --warmup, then the repeated intervals; the phase's figures.

    A Slurm call is logged when it ends, and counted in the interval it started in: the log is
    read once every component has stopped, so no call still running at an interval's end is lost.
    """
    watch = MemoryWatch(components)
    watch.start()
    time.sleep(max(0.0, args.warmup - (time.time_ns() - started_ns) / 1e9))
    calls, total, per_type = controller_us(fleet.counters())
    now = time.time_ns()
    startup = {"seconds": round((now - started_ns) / 1e9, 1), "rpcs": calls, "controller_ms": total / 1000,
               "rpc_types": per_type, "span": (started_ns, now)}
    intervals = []
    length = args.duration / args.intervals
    for _ in range(args.intervals):
        fleet.reset_counters()
        since = time.time_ns()
        time.sleep(length)
        calls, total, per_type = controller_us(fleet.counters())
        until = time.time_ns()
        intervals.append({"seconds": round((until - since) / 1e9, 2), "rpcs": calls, "controller_us": total,
                          "rpc_types": per_type, "span": (since, until)})
        dead = [c.name for c in components if c.proc.poll() is not None]
        if dead:
            say(f"exited during the measurement: {', '.join(dead)} (see their logs)")
    watch.done.set()
    watch.join()
    alive = [c for c in components if c.proc.poll() is None]
    stop(alive)
    startup["slurm_calls"] = call_summary(read_shim_log(shim_log, prefix, *startup.pop("span")))
    for interval in intervals:
        shimmed = read_shim_log(shim_log, prefix, *interval.pop("span"))
        interval.update({"slurm_calls": call_summary(shimmed), "client_calls": len(shimmed),
                         "bytes": sum(c["bytes"] for c in shimmed)})
    return {"startup": startup, "intervals": intervals,
            "exited_early": [c.name for c in components if c not in alive],
            "memory": [{"component": c.name, "own_peak_mb": round(c.own_peak_kb / 1024, 1),
                        "tree_peak_mb": round(c.tree_peak_kb / 1024, 1),
                        "children_peak_mb": {k: round(v / 1024, 1) for k, v in sorted(c.child_peak_kb.items())}}
                       for c in components]}


def summarize(phase: dict, instances: int, nodes: int) -> dict:
    """Per instance per hour (median, min, max over the intervals) and the fleet-scaled figures."""
    per_hour = [i["controller_us"] / i["seconds"] * 3600 / 1e3 / instances for i in phase["intervals"]]
    per_call_bytes = [i["bytes"] / i["client_calls"] for i in phase["intervals"] if i["client_calls"]]
    polls = sum(i["client_calls"] for i in phase["intervals"])
    total_us = sum(i["controller_us"] for i in phase["intervals"])
    memory = phase["memory"]
    seconds = sum(i["seconds"] for i in phase["intervals"])
    counts: dict[str, int] = {}
    for interval in phase["intervals"]:
        for command, seen in interval["slurm_calls"].items():
            counts[command] = counts.get(command, 0) + seen["count"]
    rpcs: dict[str, list[int]] = {}
    for interval in [*phase["intervals"]]:
        for kind, seen in interval["rpc_types"].items():
            total = rpcs.setdefault(kind, [0, 0])
            total[0] += seen["count"]
            total[1] += seen["total_us"]
    out = {
        "ctld_ms_per_rpc": {k: round(us / n / 1e3, 2) for k, (n, us) in sorted(rpcs.items()) if n},
        "slurm_calls_per_hour": {k: v / seconds * 3600 / instances for k, v in sorted(counts.items())},
        "ctld_ms_per_hour": {"whole": total_us / 1e3 / seconds * 3600 / instances,
                             "median": statistics.median(per_hour), "min": min(per_hour), "max": max(per_hour),
                             "p90": percentile(per_hour, 0.9)},
        "rpcs_per_hour": sum(i["rpcs"] for i in phase["intervals"]) / seconds * 3600 / instances,
        "bytes_per_call": statistics.median(per_call_bytes) if per_call_bytes else 0,
        "ctld_ms_per_client_call": total_us / 1e3 / polls if polls else 0.0,
        "own_peak_mb": max((m["own_peak_mb"] for m in memory), default=0),
        # wait4 misses a child its caller killed (reparented when the shim died): take the samples too.
        "tree_peak_mb": max((max(m["tree_peak_mb"], *m["children_peak_mb"].values(), 0) for m in memory),
                            default=0),
    }
    us_per_s = out["ctld_ms_per_hour"]["whole"] * 1e3 / 3600  # per instance, over the whole phase
    out["ctld_us_per_instance_per_s"] = us_per_s
    out["fleet_ctld_s_per_s"] = us_per_s * nodes / 1e6  # healthd: one per node
    return out


# ---- the phases ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Code:
    """One checkout under test, as the components see it."""

    label: str
    checkout: Path
    tree: Path


def component_env(fleet: Fleet, code: Code, python: Python, shim_dir: Path, name: str,
                  extra: dict[str, str]) -> dict[str, str]:
    return fleet.env({"PATH": f"{shim_dir}:{fleet_mod.SYSTEM_PATH}", "PYTHONPATH": f"{code.tree}:{python.site_packages}",
                      "FLEET_COMPONENT": name, "PYTHONDONTWRITEBYTECODE": "1", **extra})


def healthd_phase(fleet: Fleet, code: Code, python: Python, work: Path, shim_dir: Path, shim_log: Path,
                  args: argparse.Namespace) -> dict:
    lib = work / "lib" / "libnvidia-ml.so.1"
    if not lib.exists():
        build_nvml(lib)
    components = []
    fleet.reset_counters()
    started = time.time_ns()
    for i, node in enumerate(fleet.shape.spread(args.healthd)):
        home = work / code.label / f"healthd-{i}"
        for sub in ("state", "journal", "records", "nvml"):
            (home / sub).mkdir(parents=True, exist_ok=True)
        (home / "kmsg").touch()
        (home / "nvml" / "events").touch()
        config = home / "healthd.toml"
        config.write_text("\n".join([
            f'node = "{node}"', f'kmsg = "{home / "kmsg"}"', f'state_dir = "{home / "state"}"',
            f'journal_dir = "{home / "journal"}"', f'job_records_dir = "{home / "records"}"',
            "dry_run = true", 'metrics = ""', 'disk_paths = ["/"]',
            *([f"check_interval = {args.check_interval}"] if args.check_interval else []),
            "[checks]", "expected_gpus = 8", "disk_min_free = 0.0", "memory_min_available = 0.0", ""]))
        name = f"healthd:{code.label}:{i}"
        env = component_env(fleet, code, python, shim_dir, name,
                            {"LD_LIBRARY_PATH": str(lib.parent), "NVML_EMU_DIR": str(home / "nvml")})
        argv = fleet.argv([python.executable, *entry_point(code.checkout, "healthd"), "run", "--config", str(config)])
        log = open(home / "healthd.log", "ab")
        components.append(Component(name, subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                                           stderr=subprocess.STDOUT, env=env, cwd=home)))
        log.close()
    return measure(fleet, components, f"healthd:{code.label}:", shim_log, args, started)


SPEC = """# fleet bench: a run whose job pends in the fleet's queue (no node ever answers)
[job]
name = "{name}"
nodes = 2
gpus_per_node = 8
time = "1:00:00"

[launch]
command = ["true"]
"""


def supervisor_phase(fleet: Fleet, code: Code, python: Python, work: Path, shim_dir: Path, shim_log: Path,
                     args: argparse.Namespace) -> dict:
    components = []
    job_name = f"fleet-bench-{code.label}"
    fleet.reset_counters()
    started = time.time_ns()
    for i in range(args.supervisors):
        home = work / code.label / f"user-{i}"
        runs, records = home / "runs", home / "records"
        runs.mkdir(parents=True, exist_ok=True)
        records.mkdir(parents=True, exist_ok=True)
        spec = home / "job.toml"
        spec.write_text(SPEC.format(name=job_name))
        name = f"supervisor:{code.label}:{i}"
        env = component_env(fleet, code, python, shim_dir, name,
                            {"CLUSTERCTL_RUNS": str(runs), "CLUSTERCTL_JOB_RECORDS": str(records)})
        run_dir = runs / "run"
        clusterctl = [python.executable, *entry_point(code.checkout, "clusterctl")]
        submitted = subprocess.run(fleet.argv([*clusterctl, "submit", str(spec), "--run-dir", str(run_dir)]),
                                   capture_output=True, text=True, env=env, timeout=600, cwd=home)
        if submitted.returncode != 0:
            raise SystemExit(f"{name}: clusterctl submit failed ({submitted.returncode}): "
                             f"{(submitted.stderr or submitted.stdout).strip()[-800:]}")
        log = open(home / "supervisor.log", "ab")
        components.append(Component(name, subprocess.Popen(
            fleet.argv([*clusterctl, "supervise", str(run_dir), "--job-records", str(records)]),
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=home)))
        log.close()
    result = measure(fleet, components, f"supervisor:{code.label}:", shim_log, args, started)
    fleet.run(["scancel", "--name", job_name], check=False)
    return result


# ---- what one Slurm query costs -------------------------------------------------------------------
PROBES: tuple[tuple[str, ...], ...] = (
    ("sinfo", "--json"), ("sinfo", "--json", "-n", "{node}"), ("sinfo", "-h", "-n", "{node}", "-o", "%T|%E"),
    ("scontrol", "show", "node", "{node}"), ("scontrol", "show", "node", "{node}", "--json"),
    ("squeue", "--json"), ("squeue", "--json", "-j", "{job}"), ("squeue", "-h", "-j", "{job}", "-o", "%T"),
    ("scontrol", "show", "job", "{job}"), ("squeue", "--only-job-state", "--json"),
    ("squeue", "--only-job-state", "-j", "{job}"),
)
"""Queries a component may make, each asked alone: which RPC it becomes, and what that costs."""


def probe(fleet: Fleet, repeat: int = 3, timeout: float = 60) -> list[dict]:
    """Each of PROBES `repeat` times on its own: RPCs, median controller time, bytes, client wall.

    A call still running after `timeout` s is killed and reported with exit -1 (not repeated).
    """
    node, job = fleet.shape.node(0), "2"  # job 2: the first task split out of the first array
    found = []
    for template in PROBES:
        argv = [a.format(node=node, job=job) for a in template]
        runs = []
        for _ in range(repeat):
            fleet.reset_counters()
            started = time.monotonic()
            try:
                done = subprocess.run(fleet.argv(argv), capture_output=True, env=fleet.env(), timeout=timeout)
                size, code = len(done.stdout), done.returncode
            except subprocess.TimeoutExpired:
                size, code = 0, -1  # a client that takes this long is an answer too: say so, go on
            wall = time.monotonic() - started
            _, total, per_type = controller_us(fleet.counters())
            runs.append((total, wall, size, code, per_type))
            if code == -1:
                break
        runs.sort(key=lambda r: r[0])
        total, wall, size, code, per_type = runs[len(runs) // 2]
        found.append({"argv": " ".join(argv), "exit": code, "rpcs": sorted(per_type), "ctld_ms": total / 1e3,
                      "bytes": size, "wall_s": round(wall, 2)})
    return found


def probe_table(release: str, probes: list[dict]) -> str:
    """The probes of one release as a table."""
    rows = [f"| Slurm {release}: query | RPCs | ctld ms (median of 3) | bytes | client wall s |", "|---|---|---:|---:|---:|"]
    for p in probes:
        rpcs = ", ".join(r.removeprefix("REQUEST_") for r in p["rpcs"]) or f"none (exit {p['exit']})"
        if p["exit"] == -1:
            rpcs += " — client killed after the timeout"
        argv = p["argv"].replace("|", "\\|")
        rows.append(f"| `{argv}` | {rpcs} | {p['ctld_ms']:,.2f} | {p['bytes']:,} | {p['wall_s']} |")
    return "\n".join(rows)


# ---- report ------------------------------------------------------------------------------------
def table(results: list[dict]) -> str:
    """The stdout table: one row per release, code and component."""
    head = ("| Slurm | code | component | n | ctld ms/h per instance: all intervals (median [min–max]) | "
            "ctld ms per RPC | Slurm calls/h per instance | KB per call | fleet-scaled | peak RSS MB own / with children |")
    rows = [head, "|" + "---|" * 10]
    for r in results:
        if "error" in r:
            rows.append(f"| {r['slurm']} | {r.get('code', '')} | {r.get('component', '')} | | failed: "
                        f"{r['error'][:200]} ||||||")
            continue
        s = r["summary"]
        whole, med, lo, hi = (s["ctld_ms_per_hour"][k] for k in ("whole", "median", "min", "max"))
        if r["component"] == "healthd":
            scaled = (f"{s['ctld_us_per_instance_per_s']:,.0f} µs/node/s (budget 1) = {s['fleet_ctld_s_per_s']:,.2f} ctld s/s "
                      f"at {r['nodes']:,} nodes")
        else:
            scaled = f"{s['ctld_us_per_instance_per_s'] / 1e3:,.1f} ctld ms/s per run"
        rpcs = "; ".join(f"{k.removeprefix('REQUEST_')} {v:,.1f}" for k, v in s["ctld_ms_per_rpc"].items())
        calls = "; ".join(f"{k} {v:,.0f}" for k, v in s["slurm_calls_per_hour"].items()) or (
            "none completed (killed by the caller's timeout?)" if s["rpcs_per_hour"] else "none")
        component = r["component"] + (f" ({len(r['phase']['exited_early'])} exited early: see its log)"
                                      if r["phase"]["exited_early"] else "")
        rows.append(f"| {r['slurm']} | {r['code']} | {component} | {r['instances']} | "
                    f"{whole:,.0f} ({med:,.0f} [{lo:,.0f}–{hi:,.0f}]) | {rpcs} | {calls} | {s['bytes_per_call'] / 1e3:,.1f} | "
                    f"{scaled} | {s['own_peak_mb']:,.0f} / {s['tree_peak_mb']:,.0f} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slurm", action="append", choices=list(versions.RELEASES),
                        help="Slurm release to run (repeatable; default: host)")
    parser.add_argument("--code", action="append", type=Path, metavar="CHECKOUT",
                        help="a checkout whose code the components run (repeatable; default: this one)")
    parser.add_argument("--nodes", type=int, default=12_500)
    parser.add_argument("--jobs", type=int, default=50_000, help="queued held jobs")
    parser.add_argument("--healthd", type=int, default=2, help="healthd daemons (0: skip)")
    parser.add_argument("--supervisors", type=int, default=1, help="supervised runs (0: skip)")
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds per component and code")
    parser.add_argument("--intervals", type=int, default=3, help="--duration is split into this many intervals")
    parser.add_argument("--warmup", type=float, default=20.0, help="start-up seconds, reported apart")
    parser.add_argument("--check-interval", type=float, help="healthd check_interval (default: healthd's own)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/fleet-bench"))
    parser.add_argument("--out", type=Path, default=HERE / "results" / "fleet.json")
    parser.add_argument("--probe", action="store_true",
                        help="first ask each single Slurm query a component may use, alone: its RPCs and cost")
    parser.add_argument("--release-out", type=Path, help=argparse.SUPPRESS)  # one release, inside the namespaces
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("fleet_bench needs root (namespaces, bind mounts, chroot)")
    checkouts = [c.resolve() for c in (args.code or [CHECKOUT])]
    names = [c.name for c in checkouts]
    labels = [c.name if names.count(c.name) == 1 else f"{c.name}-{i}" for i, c in enumerate(checkouts)]
    if args.release_out is not None:  # the child: one release, in its own namespaces
        release = versions.release(args.slurm[0])
        root = rootfs.cached_root(release) if release.suite else None
        work = args.work / release.name
        shape = FleetShape(nodes=args.nodes, jobs=args.jobs)
        args.release_out.write_text(json.dumps(run_release(release, root, shape, work, checkouts, labels, args)))
        return
    results = []
    for name in args.slurm or [versions.HOST]:
        # Each release in namespaces of its own: its controller's network, its root filesystem's mounts.
        work = args.work / name
        subprocess.run(["rm", "-rf", str(work)], check=True)
        work.mkdir(parents=True)
        out = work / "results.json"
        argv = [sys.executable, str(Path(__file__).resolve()), *strip_slurm(sys.argv[1:]), "--slurm", name,
                "--release-out", str(out)]
        done = subprocess.run(fleet_mod.namespace_argv(argv), env={**os.environ, NAMESPACE_MARK: "1"})
        if done.returncode != 0 or not out.exists():
            say(f"Slurm {name}: the run failed (exit {done.returncode}); see {work}/log")
            results.append({"slurm": name, "error": f"exit {done.returncode}"})
            continue
        results += json.loads(out.read_text())
    for r in results:
        if r.get("component") == "probe":
            print(probe_table(r["slurm"], r["probes"]) + "\n")
    results = [r for r in results if r.get("component") != "probe"] + [r for r in results
                                                                      if r.get("component") == "probe"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    document = {"argv": sys.argv, "nodes": args.nodes, "jobs": args.jobs, "duration": args.duration,
                "intervals": args.intervals, "codes": {label: str(c) for label, c in zip(labels, checkouts)},
                "results": results}
    args.out.write_text(json.dumps(document, indent=1))
    print(table([r for r in results if r.get("component") != "probe"]))
    say(f"wrote {args.out}")


def strip_slurm(argv: list[str]) -> list[str]:
    """`argv` without its --slurm options (the child is given one)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--slurm":
            skip = True
        elif not arg.startswith("--slurm="):
            out.append(arg)
    return out


def run_release(release: versions.Release, root: Path | None, shape: FleetShape, work: Path, checkouts: list[Path],
                labels: list[str], args: argparse.Namespace) -> list[dict]:
    """Every code's components against one release's controller."""
    fleet = Fleet(release, root, shape, work)
    fleet.enter()
    python = python_for(root)
    shim_dir, shim_log = work / "shim", work / "slurm-calls.tsv"
    shim_dir.mkdir()
    for command in SLURM_COMMANDS:
        (shim_dir / command).write_text(SHIM.format(tmp=shim_dir, real=f"/usr/bin/{command}", name=command,
                                                    log=shim_log))
        (shim_dir / command).chmod(0o755)
    codes = []
    for label, checkout in zip(labels, checkouts):
        fleet.bind(checkout)
        codes.append(Code(label, checkout, code_tree(checkout, work / "code" / label)))
    results = []
    try:
        fleet.start(say)
        if args.probe:
            say("probing single queries")
            results.append({"slurm": release.name, "version": fleet.version, "component": "probe",
                            "probes": probe(fleet)})
        for code in codes:
            for component, count, phase in (("healthd", args.healthd, healthd_phase),
                                            ("supervisor", args.supervisors, supervisor_phase)):
                if count <= 0:
                    continue
                say(f"Slurm {release.name}, code {code.label}: {count} × {component} for {args.duration:g} s")
                try:
                    measured = phase(fleet, code, python, work, shim_dir, shim_log, args)
                except SystemExit as exc:
                    say(f"{component} of {code.label} failed: {exc}")
                    results.append({"slurm": release.name, "version": fleet.version, "code": code.label,
                                    "component": component, "error": str(exc)})
                    continue
                for leftover in shim_dir.glob("shim.*"):  # outputs of calls killed by their caller
                    leftover.unlink(missing_ok=True)
                results.append({"slurm": release.name, "version": fleet.version, "code": code.label,
                                "component": component, "instances": count, "nodes": shape.nodes,
                                "jobs": shape.jobs, "phase": measured,
                                "summary": summarize(measured, count, shape.nodes)})
    finally:
        fleet.stop()
        # The controller's saved state (50,000 jobs) and killed calls' outputs: gigabytes nobody reads.
        subprocess.run(["rm", "-rf", str(work / "state"), *map(str, shim_dir.glob("shim.*"))], check=False)
    return results


if __name__ == "__main__":
    main()
