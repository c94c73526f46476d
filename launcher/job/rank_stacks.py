"""A hung step's evidence: each stuck rank's Python stack, read on its node before the step is ended.

Two sides.  On the batch host, the agent (`keep_hang_stacks`, through `AgentDoors.dump_stacks`) runs

    srun --overlap --jobid=J --nodelist=<nodes> --ntasks-per-node=1 ... python -m clusterctl.launcher.job stacks

on the nodes `clusterctl.launcher.pure.hang_stacks.nodes_to_dump` picks (the stuck ones, at most 8,
and 2 healthy ones: never the whole job), within STACKS_STEP_SECONDS, then reads the records the nodes
wrote and summarises them.  On each of those nodes, `stacks_main` finds the step's ranks in their
progress files (node-local, `$CLUSTERCTL_NODE_DIR/progress/`, else the job directory's), runs
`py-spy dump --json --pid P` for all of them at once, bounded by STACKS_NODE_SECONDS in all, copies
PyTorch's flight-recorder dumps of those ranks if the job enabled it, and writes one
`clusterctl.records.node_stacks` record to `<job_dir>/stacks/<node>.json`.

Nothing here may hold a recovery up beyond its bound or fail it: py-spy missing, a process gone, ptrace
refused, no answer in time — each is written in the record as such, and an srun that does not end is
killed at STACKS_STEP_SECONDS.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from clusterctl.launcher.pure.hang_stacks import nodes_to_dump, summarize_stacks
from clusterctl.launcher.pure.hang_watch import HangVerdict
from clusterctl.launcher.shared.straggler_actions import run_one_off_step
from clusterctl.node_dir import node_dir_path
from clusterctl.records.node_report import REPORT_LAUNCH_ENV
from clusterctl.records.node_stacks import (
    MAX_FRAMES, Frame, NodeStacks, RankStack, read_node_stacks, stacks_dir, write_node_stacks,
)
from clusterctl.records.rank_progress import RankProgress, read_progress
from clusterctl.records.versioned import RecordError
from clusterctl.slurm import hostlist
from clusterctl.text import one_line

STACKS_NODE_SECONDS = 8.0
"""On one node, every rank's dump together (they run at once): py-spy answers in well under a second
for a live process, so this bounds only the ones that do not answer."""
STACKS_STEP_SECONDS = 20.0
"""The whole srun of the stacks step, from the batch host: a step's start (1-3 s) and the node's bound."""
MAX_RANKS_PER_NODE = 32
"""Ranks dumped per node (a node runs one rank per GPU: 8 on most)."""
FLIGHT_RECORDER_BYTES = 64 << 20
"""The largest flight-recorder dump copied (a bigger one is named in the notes, not copied)."""
DEFAULT_FLIGHT_RECORDER_PREFIX = "/tmp/nccl_trace_rank_"
"""Where PyTorch writes a rank's flight-recorder dump when TORCH_FR_DUMP_TEMP_FILE does not say (`<prefix><rank>`)."""

StacksDoor = Callable[[Sequence[str], Path, str, Mapping[str, str]], str]
"""Run the stacks command on `nodes` for the step whose files are in `job_dir` (its launch); what went
wrong with the step as a whole ('' when it ran), never raising."""


def stacks_srun_argv(python: str, job_id: str, nodes: Sequence[str], job_dir: Path, launch: str) -> list[str]:
    """The srun that runs the stacks command once on each of `nodes`, beside the hung step (--overlap:
    on the resources it holds)."""
    return ["srun", "--overlap", f"--jobid={job_id}", f"--nodelist={hostlist.compress(sorted(nodes))}",
            f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
            "--quiet", python, "-m", "clusterctl.launcher.job", "stacks", "--job-dir", str(job_dir),
            "--launch", launch]


def srun_stacks(python: str) -> StacksDoor:
    """The real door: srun of `stacks_srun_argv`, killed at STACKS_STEP_SECONDS."""
    def run(nodes: Sequence[str], job_dir: Path, launch: str, env: Mapping[str, str]) -> str:
        argv = stacks_srun_argv(python, env.get("SLURM_JOB_ID", ""), nodes, job_dir, launch)
        # The agent's SLURM_HOSTFILE and distribution lay out the training step, not this one.
        step_env = {k: v for k, v in env.items() if k not in ("SLURM_HOSTFILE", "SLURM_DISTRIBUTION")}
        done = run_one_off_step(argv, step_env, STACKS_STEP_SECONDS, "the stacks step")
        return done if isinstance(done, str) else ""
    return run


def keep_hang_stacks(door: StacksDoor | None, job_dir: Path, launch: str, slots: Sequence[str],
                     hang: HangVerdict, env: Mapping[str, str]) -> tuple[str, ...]:
    """Ask the hung step's stuck nodes (and a few others) for their ranks' stacks, and summarise what
    they wrote (clusterctl.launcher.pure.hang_stacks); the summary's lines (empty: no door)."""
    if door is None:
        return ()
    nodes = nodes_to_dump(hang.suspect_nodes, slots)
    problem = door(nodes, job_dir, launch, env)
    records: list[NodeStacks] = []
    unreadable: list[str] = []
    for node in nodes:
        try:
            record = read_node_stacks(stacks_dir(job_dir) / f"{node}.json")
        except FileNotFoundError:
            continue
        except (OSError, RecordError) as exc:
            unreadable.append(one_line(str(exc))[:200])
            continue
        if record.launch == launch:
            records.append(record)
    lines = summarize_stacks(records, nodes, [r for s in hang.suspects for r in s.ranks])
    return (*lines, *(f"unreadable: {u}" for u in unreadable), *((problem,) if problem else ()))


# ---- on each node ------------------------------------------------------------------------------

def find_py_spy(python: str = sys.executable, path: str | None = None) -> str | None:
    """py-spy beside `python` (the venv clusterctl runs from: the dependency installs it there), else on PATH."""
    search = os.pathsep.join([str(Path(python).parent), path if path is not None else os.environ.get("PATH", "")])
    return shutil.which("py-spy", path=search)


def parse_py_spy_dump(raw: bytes) -> tuple[tuple[Frame, ...], int]:
    """The training thread's frames (innermost first: the main thread, else the first one py-spy lists) and
    the number of threads, from `py-spy dump --json`; ValueError for output that is not that."""
    threads = json.loads(raw.decode("utf-8", errors="replace"))
    if not isinstance(threads, list) or not threads or not all(isinstance(t, dict) for t in threads):
        raise ValueError("py-spy's answer is not a list of threads")
    main = next((t for t in threads if t.get("thread_name") == "MainThread"), threads[0])
    frames = main.get("frames")
    if not isinstance(frames, list):
        raise ValueError("py-spy's thread has no frames")
    kept = []
    for frame in frames[:MAX_FRAMES]:
        name, file, line = frame.get("name"), frame.get("filename"), frame.get("line")
        if isinstance(name, str) and isinstance(file, str) and isinstance(line, int) and line >= 0:
            kept.append(Frame(name[:300], file[:300], line))
    return tuple(kept), len(threads)


def _failure(returncode: int, stderr: bytes, pid: int) -> tuple[str, str]:
    """The status and note of a py-spy dump that failed."""
    said = stderr.decode(errors="replace")
    first = next((line.strip() for line in said.splitlines() if line.strip()), f"exit {returncode}")
    if not Path(f"/proc/{pid}").exists():
        return "gone", ""
    if "ermission" in said or "not permitted" in said:
        return "refused", one_line(first)[:200]
    return "failed", one_line(first)[:200]


def dump_stacks(ranks: Sequence[RankProgress], py_spy: str | None, budget: float = STACKS_NODE_SECONDS,
                *, monotonic: Callable[[], float] = time.monotonic) -> tuple[RankStack, ...]:
    """Each rank's stack by `py-spy dump --json`, all started at once and given `budget` seconds in all;
    what became of each (a rank never raises: see clusterctl.records.node_stacks.STACK_STATUSES)."""
    if py_spy is None:
        return tuple(RankStack(r.rank, r.pid, "no-py-spy") for r in ranks)
    deadline = monotonic() + budget
    started: list[tuple[RankProgress, subprocess.Popen[bytes] | RankStack]] = []
    for r in ranks:
        if r.pid <= 0:
            started.append((r, RankStack(r.rank, 0, "not-tried", note="its progress report has no pid")))
        elif not Path(f"/proc/{r.pid}").exists():
            started.append((r, RankStack(r.rank, r.pid, "gone")))
        else:
            try:
                started.append((r, subprocess.Popen([py_spy, "dump", "--json", "--pid", str(r.pid)],
                                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                    stderr=subprocess.PIPE)))
            except OSError as exc:
                started.append((r, RankStack(r.rank, r.pid, "failed", note=f"cannot run py-spy: {exc.strerror}")))
    stacks: list[RankStack] = []
    for r, running in started:
        if isinstance(running, RankStack):
            stacks.append(running)
            continue
        try:
            out, err = running.communicate(timeout=max(0.0, deadline - monotonic()))
        except subprocess.TimeoutExpired:
            running.kill()
            running.communicate()
            stacks.append(RankStack(r.rank, r.pid, "timed-out", note=f"no answer within {budget:g} s"))
            continue
        if running.returncode != 0:
            status, note = _failure(running.returncode, err, r.pid)
            stacks.append(RankStack(r.rank, r.pid, status, note=note))
            continue
        try:
            frames, threads = parse_py_spy_dump(out)
        except ValueError as exc:
            stacks.append(RankStack(r.rank, r.pid, "failed", note=str(exc)))
            continue
        stacks.append(RankStack(r.rank, r.pid, "dumped", frames, threads))
    return tuple(stacks)


def keep_flight_recorder(environ: Mapping[str, str], ranks: Sequence[int], into: Path) -> tuple[tuple[str, ...], str]:
    """Copy the flight-recorder dumps of `ranks` (PyTorch writes `<TORCH_FR_DUMP_TEMP_FILE><rank>` when
    the NCCL watchdog times out, if TORCH_NCCL_TRACE_BUFFER_SIZE is set) into `into`; their names, and
    a note when there are none or some could not be copied."""
    prefix = environ.get("TORCH_FR_DUMP_TEMP_FILE") or environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") or ""
    buffer = environ.get("TORCH_FR_BUFFER_SIZE") or environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or "0"
    if not prefix and buffer.strip() in ("", "0"):
        return (), "flight recorder off in the job's environment (TORCH_NCCL_TRACE_BUFFER_SIZE not set)"
    prefix = prefix or DEFAULT_FLIGHT_RECORDER_PREFIX
    kept: list[str] = []
    problems: list[str] = []
    for rank in ranks:
        source = Path(f"{prefix}{rank}")
        try:
            size = source.stat().st_size
            if size > FLIGHT_RECORDER_BYTES:
                problems.append(f"{source} not copied ({size} bytes)")
                continue
            into.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, into / source.name)
            kept.append(source.name)
        except FileNotFoundError:
            continue
        except OSError as exc:
            problems.append(f"{source}: {exc.strerror}")
    if not kept and not problems:
        problems.append(f"no flight-recorder dump at {prefix}<rank> (PyTorch writes one when NCCL's watchdog "
                        "times out; gloo writes none)")
    return tuple(kept), "; ".join(problems)


def node_ranks(job_dir: Path, launch: str, node: str, environ: Mapping[str, str], now: float) -> tuple[RankProgress, ...]:
    """The ranks of launch `launch` on `node`, from their node-local progress files (else the job directory's)."""
    from clusterctl.launcher.job.reporter import read_node_progress
    local = node_dir_path(environ.get("SLURM_JOB_ID", ""), launch, node, environ)
    found = read_node_progress(local, now) if local.is_dir() else ()
    if not found:
        found = tuple(r for r in read_progress(job_dir, now)[0] if r.node == node)
    return tuple(sorted(found, key=lambda r: r.rank))[:MAX_RANKS_PER_NODE]


def stacks_main(job_dir: Path, launch: str, environ: Mapping[str, str]) -> int:
    """`python -m clusterctl.launcher.job stacks`: this node's ranks' stacks into `<job_dir>/stacks/<node>.json`."""
    node = environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    now = time.time()
    ranks = node_ranks(job_dir, launch or environ.get(REPORT_LAUNCH_ENV, "0"), node, environ, now)
    notes: list[str] = [] if ranks else ["no progress file of this step's ranks on this node"]
    stacks = dump_stacks(ranks, find_py_spy())
    kept, note = keep_flight_recorder(environ, [r.rank for r in ranks], stacks_dir(job_dir) / "flight-recorder" / node)
    notes += [note] if note else []
    record = NodeStacks(node, environ.get("SLURM_JOB_ID", ""), launch, now, stacks, kept, tuple(notes))
    try:
        write_node_stacks(job_dir, record)
    except (OSError, RecordError) as exc:
        print(f"clusterctl stacks: cannot write the stacks of {node}: {exc}", file=sys.stderr)
        return 1
    return 0
