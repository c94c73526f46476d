"""A fault on every node at once: what healthd's drains and breaker then cost one shared slurmctld.

    sudo .venv/bin/python bench/healthd_event_bench.py [--slurm host] [--slurm 26.05] \\
        [--code /tmp/old --code .] [--healthd 20] [--duration 120]

The fleet of bench/fleet_bench.py (a real slurmctld with a 12,500-node table, no slurmd, in
private namespaces; clusterctl_testbed.fleet).  For each `--code` checkout: --healthd real
daemons (not a dry run, emulated NVML), each one node of the fleet, with a breaker that lets
at most half of them drain (`breaker_max_share` = (healthd / 2) / nodes: the same proportion a
real fleet-wide event meets at 10%).  After --warmup s every daemon's GPU 0 shows 63 retired
pages at once (a periodic finding that stays: a bad driver rollout looks like this), and for
--duration s slurmctld's own counters (sdiag) and a shim in front of every Slurm command say
what the event cost: RPCs of each type per node, controller ms per node, bytes, how many nodes
were drained and how many breaker alerts were raised.  Drained nodes are resumed between codes.
With --ledger, each code that knows `breaker_dir` runs a second time (labelled `+ledger`) with a
shared breaker directory: the breaker's drain slots instead of a whole-table count per node.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet_bench as fb  # noqa: E402

from clusterctl.records.healthd_state import read_healthd_state  # noqa: E402
from clusterctl.slurm.hostlist import compress  # noqa: E402
from clusterctl.slurm.nodes import parse_partition_share  # noqa: E402
from clusterctl_testbed import fleet as fleet_mod  # noqa: E402
from clusterctl_testbed import rootfs, versions  # noqa: E402
from clusterctl_testbed.cluster import build_nvml  # noqa: E402
from clusterctl_testbed.fleet import NAMESPACE_MARK, SLURM_COMMANDS, Fleet, FleetShape  # noqa: E402
from clusterctl_testbed.gpu_faults import Fault, inject  # noqa: E402

HERE = Path(__file__).resolve().parent


def event_phase(fleet: Fleet, code: fb.Code, python: fb.Python, work: Path, shim_dir: Path, shim_log: Path,
                args: argparse.Namespace, ledger: Path | None = None) -> dict:
    lib = work / "lib" / "libnvidia-ml.so.1"
    if not lib.exists():
        build_nvml(lib)
    nodes = fleet.shape.spread(args.healthd)
    share = (args.healthd // 2) / fleet.shape.nodes
    components, homes = [], []
    label = f"{code.label}+ledger" if ledger else code.label
    if ledger is not None:
        ledger.mkdir(mode=0o755, parents=True)
    for i, node in enumerate(nodes):
        home = work / label / f"event-{i}"
        for sub in ("state", "journal", "records", "nvml"):
            (home / sub).mkdir(parents=True, exist_ok=True)
        (home / "kmsg").touch()
        (home / "nvml" / "events").touch()
        (home / "healthd.toml").write_text("\n".join([
            f'node = "{node}"', f'kmsg = "{home / "kmsg"}"', f'state_dir = "{home / "state"}"',
            f'journal_dir = "{home / "journal"}"', f'job_records_dir = "{home / "records"}"',
            'metrics = ""', 'disk_paths = ["/"]', f"breaker_max_share = {share!r}",
            *([f'breaker_dir = "{ledger}"'] if ledger else []),
            "[checks]", "expected_gpus = 8", "disk_min_free = 0.0", "memory_min_available = 0.0", ""]))
        name = f"event:{label}:{i}"
        env = fb.component_env(fleet, code, python, shim_dir, name,
                               {"LD_LIBRARY_PATH": str(lib.parent), "NVML_EMU_DIR": str(home / "nvml")})
        argv = fleet.argv([python.executable, *fb.entry_point(code.checkout, "healthd"), "run", "--config",
                           str(home / "healthd.toml")])
        log = open(home / "healthd.log", "ab")
        components.append(fb.Component(name, subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                                              stderr=subprocess.STDOUT, env=env, cwd=home)))
        log.close()
        homes.append(home)
    time.sleep(args.warmup)
    fleet.reset_counters()
    since = time.time_ns()
    for home in homes:  # every node at once
        inject(home / "nvml", Fault("retired-pages", gpu=0, value=63))
    time.sleep(args.duration)
    calls, total_us, per_type = fb.controller_us(fleet.counters())
    until = time.time_ns()
    drained = parse_partition_share(fleet.run(["sinfo", "-h", "-p", fleet.shape.partition, "-o", "%D|%T|%E"]),
                                    fleet.shape.partition).drained_by_us
    alerts = 0
    for home in homes:
        try:
            state = read_healthd_state(home / "state")
        except Exception:  # noqa: BLE001 - a state the other code writes differently counts as none
            state = None
        alerts += sum(a.alert == "breaker-open" for a in state.alerts) if state else 0
    fb.stop(components)
    shimmed = fb.read_shim_log(shim_log, f"event:{label}:", since, until)
    fleet.run(["scontrol", "update", f"NodeName={compress(nodes)}", "State=RESUME"], check=False)
    n = args.healthd
    return {"healthd": n, "cap": n // 2, "seconds": round((until - since) / 1e9, 1), "drained": drained,
            "breaker_alerts": alerts, "rpcs": calls, "controller_ms": total_us / 1e3,
            "rpc_types": per_type, "slurm_calls": fb.call_summary(shimmed),
            "per_node": {"controller_ms": total_us / 1e3 / n,
                         "rpcs": {k.removeprefix("REQUEST_"): v["count"] / n for k, v in per_type.items()},
                         "bytes": sum(c["bytes"] for c in shimmed) / n},
            "tree_peak_mb": max((c.tree_peak_kb / 1024 for c in components), default=0)}


def run_release(release: versions.Release, root: Path | None, shape: FleetShape, work: Path,
                checkouts: list[Path], labels: list[str], args: argparse.Namespace) -> list[dict]:
    fleet = Fleet(release, root, shape, work)
    fleet.enter()
    python = fb.python_for(root)
    shim_dir, shim_log = work / "shim", work / "slurm-calls.tsv"
    shim_dir.mkdir()
    for command in SLURM_COMMANDS:
        (shim_dir / command).write_text(fb.SHIM.format(tmp=shim_dir, real=f"/usr/bin/{command}", name=command,
                                                       log=shim_log))
        (shim_dir / command).chmod(0o755)
    codes = []
    for label, checkout in zip(labels, checkouts):
        fleet.bind(checkout)
        codes.append(fb.Code(label, checkout, fb.code_tree(checkout, work / "code" / label)))
    results = []
    try:
        fleet.start(fb.say)
        for code in codes:
            fb.say(f"Slurm {release.name}, code {code.label}: a fault on {args.healthd} nodes at once, "
                   f"{args.duration:g} s")
            results.append({"slurm": release.name, "version": fleet.version, "code": code.label,
                            **event_phase(fleet, code, python, work, shim_dir, shim_log, args)})
            if args.ledger and "breaker_dir" in (code.checkout / "healthd" / "config.py").read_text():
                fb.say(f"Slurm {release.name}, code {code.label} with a breaker directory: the same event")
                results.append({"slurm": release.name, "version": fleet.version, "code": f"{code.label}+ledger",
                                **event_phase(fleet, code, python, work, shim_dir, shim_log, args,
                                              ledger=work / f"breaker-{code.label}")})
    finally:
        fleet.stop()
    return results


def table(results: list[dict]) -> str:
    rows = ["| Slurm | code | nodes with the fault | drained (cap) | breaker alerts | per node: ctld ms | "
            "per node: RPCs by type | per node: KB | Slurm calls |", "|" + "---|" * 9]
    for r in results:
        rpcs = "; ".join(f"{k} {v:.1f}" for k, v in sorted(r["per_node"]["rpcs"].items()))
        calls = "; ".join(f"{k} {v['count']}" for k, v in r["slurm_calls"].items())
        rows.append(f"| {r['slurm']} | {r['code']} | {r['healthd']} | {r['drained']} ({r['cap']}) | "
                    f"{r['breaker_alerts']} | {r['per_node']['controller_ms']:,.1f} | {rpcs} | "
                    f"{r['per_node']['bytes'] / 1e3:,.1f} | {calls} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slurm", action="append", choices=list(versions.RELEASES))
    parser.add_argument("--code", action="append", type=Path, metavar="CHECKOUT")
    parser.add_argument("--nodes", type=int, default=12_500)
    parser.add_argument("--jobs", type=int, default=1_000, help="queued held jobs (healthd never reads the queue)")
    parser.add_argument("--healthd", type=int, default=20, help="daemons, each one node with the fault")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds measured after the fault")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds between start and the fault")
    parser.add_argument("--ledger", action="store_true",
                        help="also run each code that knows breaker_dir with a shared breaker directory")
    parser.add_argument("--work", type=Path, default=Path("/tmp/healthd-event-bench"))
    parser.add_argument("--out", type=Path, default=HERE / "results" / "healthd_event.json")
    parser.add_argument("--release-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("healthd_event_bench needs root (namespaces, bind mounts, chroot)")
    checkouts = [c.resolve() for c in (args.code or [fb.CHECKOUT])]
    names = [c.name for c in checkouts]
    labels = [c.name if names.count(c.name) == 1 else f"{c.name}-{i}" for i, c in enumerate(checkouts)]
    if args.release_out is not None:
        release = versions.release(args.slurm[0])
        root = rootfs.cached_root(release) if release.suite else None
        shape = FleetShape(nodes=args.nodes, jobs=args.jobs)
        args.release_out.write_text(json.dumps(run_release(release, root, shape, args.work / release.name,
                                                           checkouts, labels, args)))
        return
    results = []
    for name in args.slurm or [versions.HOST]:
        work = args.work / name
        subprocess.run(["rm", "-rf", str(work)], check=True)
        work.mkdir(parents=True)
        out = work / "results.json"
        argv = [sys.executable, str(Path(__file__).resolve()), *fb.strip_slurm(sys.argv[1:]), "--slurm", name,
                "--release-out", str(out)]
        done = subprocess.run(fleet_mod.namespace_argv(argv), env={**os.environ, NAMESPACE_MARK: "1"})
        if done.returncode != 0 or not out.exists():
            fb.say(f"Slurm {name}: the run failed (exit {done.returncode})")
            continue
        results += json.loads(out.read_text())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"argv": sys.argv, "nodes": args.nodes, "healthd": args.healthd,
                                    "duration": args.duration, "results": results}, indent=1))
    print(table(results))
    fb.say(f"wrote {args.out}")


if __name__ == "__main__":
    main()
