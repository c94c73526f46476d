"""Benchmark rank maps at fleet scale: `clusterctl plan`, the in-job `plan` step and one rank's check.

    .venv/bin/python bench/plan_scale_bench.py        # this checkout, 5 trials: bench/results/plan_scale.json
    git worktree add /tmp/before <commit>             # and a venv whose clusterctl is that worktree, then:
    .venv/bin/python bench/plan_scale_bench.py --python before=/tmp/before-venv/bin/python --python after=.venv/bin/python

Every measurement is a fresh process, as a user or a job step runs it, timed from fork to exit
(interpreter start and imports included), with its peak RSS:

- `clusterctl plan --tp 8 --pp 10 --topology <file> --nodelist n[1-N] --json > file` at N = 1,250,
  12,500 and 100,000 nodes: parse the topology file, plan, write the map as JSON;
- the in-job step `python -m clusterctl.launcher.job plan` (spec with `[placement] topology`, so
  no Slurm call) for a job on all N nodes: writes rankmap.json, hostfile, nodefile and what ranks read;
- one rank's check, `python -m clusterctl.launcher.job rank -- cat /proc/self/io`, for a rank in the
  middle of the job: its wall time, peak RSS, `rchar` (every byte the process read through
  read(2), Python's own files included) and, counted by strace, the bytes it read from the job
  directory (the map).

Cluster: a 3-level tree (32 nodes per leaf, 16 leaves per aggregation switch, one core), as in
bench/rankmap_bench.py.  The benchmark imports nothing from the repository; each `--python` is an
interpreter whose clusterctl is measured, and their trials alternate (before, after, before, ...) so
a busy machine slows both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stats import percentile  # noqa: E402

TP, PP, GPN = 8, 10, 8
CLI = "from clusterctl.launcher.login.cli import main; main()"


def topology_conf(nodes: int) -> str:
    """topology.conf for `nodes` nodes n1..nN: 32 per leaf, 16 leaves per aggregation switch, one core."""
    leaves = -(-nodes // 32)
    lines = [f"SwitchName=l{i} Nodes=n[{i * 32 + 1}-{min(i * 32 + 32, nodes)}]" for i in range(leaves)]
    aggs = -(-leaves // 16)
    lines += [f"SwitchName=a{a} Switches=l[{a * 16}-{min(a * 16 + 15, leaves - 1)}]" for a in range(aggs)]
    lines.append(f"SwitchName=core Switches=a[0-{aggs - 1}]")
    return "\n".join(lines) + "\n"


def nodelist(nodes: int) -> str:
    """n1..nN as a hostlist whose ranges stay within Slurm's 65,536 hosts per range."""
    step = 32_768
    return "n[" + ",".join(f"{lo}-{min(lo + step - 1, nodes)}" for lo in range(1, nodes + 1, step)) + "]"


def spec_toml(nodes: int, topology: Path) -> str:
    return (f'[job]\nname = "fleet"\nnodes = {nodes}\ngpus_per_node = {GPN}\n[launch]\ncommand = ["true"]\n'
            f'[parallel]\ntp = {TP}\npp = {PP}\n[placement]\ntopology = "{topology}"\n')


def run_once(argv: list[str], env: dict[str, str] | None = None, stdout: Path | None = None,
             ) -> tuple[float, float, str]:
    """Run argv in a fresh process: (wall seconds from fork to exit, peak RSS in MB, stdout unless to a file).

    Output goes to files, not pipes (a child writing a long message to a pipe nobody reads would
    block), and the child is reaped with wait4 for its own rusage."""
    with tempfile.TemporaryFile() as captured, tempfile.TemporaryFile() as errors:
        out = open(stdout, "wb") if stdout else captured
        started = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=errors)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: keep Popen from waiting again
        if stdout:
            out.close()
        if proc.returncode:
            errors.seek(0)
            raise SystemExit(f"{' '.join(argv[:6])} failed: {errors.read().decode()[-2000:]}")
        captured.seek(0)
        return seconds, usage.ru_maxrss / 1024, captured.read().decode()


def interleaved(runs: dict[str, tuple[list[str], dict[str, str] | None, Path | None]],
                trials: int) -> dict[str, dict[str, Any]]:
    """Per version: median and spread (min-max) of wall time and peak RSS over `trials` fresh processes,
    the versions' trials alternating; `stdout` is the last trial's output."""
    samples: dict[str, list[tuple[float, float, str]]] = {name: [] for name in runs}
    for _ in range(trials):
        for name, (argv, env, stdout) in runs.items():
            samples[name].append(run_once(argv, env, stdout))
    return {name: {"seconds": _summary([s for s, _, _ in got], 3), "peak_rss_mb": _summary([r for _, r, _ in got], 1),
                   "trials": trials, "stdout": got[-1][2]} for name, got in samples.items()}


def _summary(values: list[float], digits: int) -> dict[str, float]:
    return {"median": round(percentile(values, 0.5), digits), "min": round(min(values), digits),
            "max": round(max(values), digits)}


def _fields(python: str, path: Path, expression: str) -> Any:
    """`expression` over the JSON file `d`, evaluated in another process: this one stays small, because a
    child's peak RSS as the kernel reports it is at least its parent's RSS when it was started."""
    code = f"import json, sys; d = json.load(open(sys.argv[1])); print(json.dumps([{expression}]))"
    return json.loads(subprocess.run([python, "-c", code, str(path)], capture_output=True, text=True,
                                     check=True).stdout)


def bench_cli(work: Path, versions: dict[str, str], nodes: int, trials: int) -> dict[str, Any]:
    """`clusterctl plan --json` on a file of `nodes` nodes, for all of them."""
    topology = work / f"topology-{nodes}.conf"
    topology.write_text(topology_conf(nodes))
    runs = {name: ([python, "-c", CLI, "plan", "--tp", str(TP), "--pp", str(PP), "--topology", str(topology),
                    "--nodelist", nodelist(nodes), "--json"], None, work / f"plan-{name}.json")
            for name, python in versions.items()}
    results = interleaved(runs, trials)
    for name, python in versions.items():
        output = work / f"plan-{name}.json"
        strategy, crossing = _fields(python, output, "d['strategy'], d['cost']['leaf_crossing_dp_pp_groups']")
        results[name].update(json_bytes=output.stat().st_size, strategy=strategy, leaf_crossing_dp_pp=crossing)
        results[name].pop("stdout")
    return {"nodes": nodes, "versions": results}


def bench_in_job(work: Path, versions: dict[str, str], nodes: int, trials: int) -> dict[str, Any]:
    """The in-job `plan` step for a job on `nodes` nodes, then one rank's check, per version."""
    topology = work / f"topology-{nodes}.conf"
    topology.write_text(topology_conf(nodes))
    plan_runs, job_dirs = {}, {}
    for name, python in versions.items():
        run = work / f"run-{nodes}-{name}"
        (run / "jobs").mkdir(parents=True, exist_ok=True)
        (run / "spec.toml").write_text(spec_toml(nodes, topology))
        # The effective spec the job reads (spec.json), made by the version under test itself.
        subprocess.run([python, "-c", "import sys, json; from pathlib import Path; "
                        "from clusterctl.launcher.pure.spec import load_spec; "
                        "from clusterctl.launcher.shared.runs import spec_document; "
                        "Path(sys.argv[2]).write_text(json.dumps(spec_document(load_spec(Path(sys.argv[1])))))",
                        str(run / "spec.toml"), str(run / "spec.json")], check=True)
        job_dirs[name] = run / "jobs" / "4242"
        env = {**os.environ, "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": nodelist(nodes)}
        plan_runs[name] = ([python, "-m", "clusterctl.launcher.job", "plan", "--run-dir", str(run),
                            "--job-dir", str(job_dirs[name])], env, None)
    plans = interleaved(plan_runs, trials)
    rank = nodes * GPN // 2 + 3  # a rank in the middle of the job, not on slot 0
    rank_runs = {}
    for name, python in versions.items():
        plans[name].pop("stdout")
        plans[name]["files_written_bytes"] = {str(p.relative_to(job_dirs[name])): p.stat().st_size
                                              for p in sorted(job_dirs[name].iterdir()) if p.is_file()}
        node = _fields(python, job_dirs[name] / "rankmap.json", f"d['slots'][{rank // GPN}]")[0]
        env = {**os.environ, "SLURM_JOB_ID": "4242", "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank % GPN),
               "SLURMD_NODENAME": node, "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(GPN))}
        rank_runs[name] = ([python, "-m", "clusterctl.launcher.job", "rank", "--job-dir", str(job_dirs[name]),
                            "--", "cat", "/proc/self/io"], env, None)
    checks = interleaved(rank_runs, trials)
    for name, result in checks.items():
        io = dict(line.split(": ") for line in result.pop("stdout").splitlines() if ": " in line)
        result["rchar_bytes"] = int(io["rchar"])
        argv, env, _ = rank_runs[name]
        result["job_dir_bytes_read"] = job_dir_bytes_read(argv, env, job_dirs[name])
    return {"nodes": nodes, "rank": rank, "versions": {name: {"plan_step": plans[name], "rank_check": checks[name]}
                                                       for name in versions}}


def job_dir_bytes_read(argv: list[str], env: dict[str, str] | None, job_dir: Path) -> int | None:
    """Bytes the process read from files in `job_dir` (read/pread of the map), counted by strace;
    None without strace."""
    if not shutil.which("strace"):
        return None
    done = subprocess.run(["strace", "-qq", "-y", "-s", "0", "-e", "trace=read,pread64,readv,preadv", *argv],
                          env=env, capture_output=True, text=True)
    total = 0
    for line in done.stderr.splitlines():
        found = STRACE_READ.match(line)
        if found and found["path"].startswith(str(job_dir)):
            total += int(found["bytes"])
    return total


STRACE_READ = re.compile(r"^(?:\[pid +\d+\] )?p?read(?:v|64)?\(\d+<(?P<path>[^>]*)>,.*\) += (?P<bytes>\d+)$")


def _range(summary: dict[str, float], unit: str, digits: int) -> str:
    return f"{summary['median']:.{digits}f}{unit} [{summary['min']:.{digits}f}-{summary['max']:.{digits}f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", action="append", default=[], metavar="NAME=PATH",
                        help="An interpreter whose clusterctl to measure (repeatable; default: this one).")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--cli-sizes", default="1250,12500,100000")
    parser.add_argument("--in-job-sizes", default="1250,12500")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "plan_scale.json")
    args = parser.parse_args()
    versions = dict(item.split("=", 1) for item in args.python) or {"this": sys.executable}
    results: dict[str, Any] = {"trials": args.trials, "versions": {}, "cli": [], "in_job": []}
    for name, python in versions.items():
        where = subprocess.run([python, "-c", "import clusterctl.launcher.pure.placement as p; print(p.__file__)"],
                               capture_output=True, text=True, check=True).stdout.strip()
        results["versions"][name] = {"python": python, "placement": where}
        print(f"{name}: {where}")
    print(f"{args.trials} trials each, median [min-max]; peak RSS in MB")
    with tempfile.TemporaryDirectory(prefix="plan-scale-") as tmp:
        work = Path(tmp)
        for nodes in (int(n) for n in args.cli_sizes.split(",") if n):
            row = bench_cli(work, versions, nodes, args.trials)
            results["cli"].append(row)
            for name, r in row["versions"].items():
                print(f"{name:>8} clusterctl plan --json {nodes:>7,} nodes: {_range(r['seconds'], ' s', 3)}, "
                      f"RSS {_range(r['peak_rss_mb'], '', 0)}, {r['json_bytes']:,} bytes out", flush=True)
        for nodes in (int(n) for n in args.in_job_sizes.split(",") if n):
            row = bench_in_job(work, versions, nodes, args.trials)
            results["in_job"].append(row)
            for name, r in row["versions"].items():
                p, c = r["plan_step"], r["rank_check"]
                print(f"{name:>8} in-job plan step      {nodes:>7,} nodes: {_range(p['seconds'], ' s', 3)}, "
                      f"RSS {_range(p['peak_rss_mb'], '', 0)}; wrote {p['files_written_bytes']}", flush=True)
                print(f"{name:>8} one rank's check      {nodes:>7,} nodes: {_range(c['seconds'], ' s', 3)}, "
                      f"RSS {_range(c['peak_rss_mb'], '', 0)}, read {c['rchar_bytes']:,} bytes in all, "
                      f"{c['job_dir_bytes_read']} of them from the job directory", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
