"""The steps a generated sbatch script runs inside the job (`python -m clusterctl.launcher.job ...`,
whose argument parsing is `clusterctl/launcher/job/__main__.py`).

- `plan`: rank map for SLURM_JOB_NODELIST → `<job dir>/rankmap.json`, `rankmap.idx`, `hostfile`, `nodefile`.
- `rank`: one per rank; checks (node, local GPU) against its slot of the map, records where it
  ran, sets RANK/LOCAL_RANK/WORLD_SIZE/MASTER_* and becomes the command.
- `node`: one per node (torchrun style); checks the node, then becomes torchrun.
- `agent`: a job with spares: plans, runs the ranks as srun steps and recovers a failed node
  inside the allocation (`clusterctl.launcher.job.agent`).

Ranks read `rankmap.idx` (the header and their own slot's line), never the whole map, so what
a rank reads from the shared filesystem does not grow with the job.

In an agent's step (the agent put its report address and key in the environment), `rank` and
`node` also give the program a node-local directory ($CLUSTERCTL_NODE_DIR, clusterctl.node_dir)
for its progress reports, and the node's first task starts the node's reporter there, detached,
before it becomes the program (`clusterctl.launcher.job.reporter`: one per node; node-local reads
only, one ~1.6 KB datagram per node per heartbeat).  Without it, reports go to the job directory.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from clusterctl.errors import ClusterctlError
from clusterctl.files import atomic_write
from clusterctl.node_dir import NODE_DIR_ENV, node_dir
from clusterctl.launcher.pure.preflight import (
    hostfile_lines, master_port, node_problems, placement_problems, rank_environment, torchrun_argv, visible_gpus,
)
from clusterctl.records.rank_index import SlotView, rank_index_path, read_slot, write_rank_index
from clusterctl.records.node_report import REPORT_ADDR_ENV, REPORT_KEY_ENV, REPORT_LAUNCH_ENV
from clusterctl.records.rank_map import JobRankMap, write_rank_map
from clusterctl.records.rank_record import RankRecord, write_rank_record

if TYPE_CHECKING:
    from clusterctl.launcher.pure.parallel import ParallelLayout
    from clusterctl.launcher.pure.placement import PlannedMap
    from clusterctl.slurm.commands import TopologySource
    from clusterctl.slurm.topology import Topology

EXIT_PREFLIGHT = 86  # a rank is not where the map says: fail the job before any work


def say(message: str) -> None:
    print(f"clusterctl: {message}", file=sys.stderr, flush=True)


def flat_topology(nodes: Sequence[str]) -> Topology:
    """All nodes under one switch: what we know when Slurm has no topology plugin."""
    from clusterctl.slurm.topology import Topology
    return Topology({"(flat)": None}, {n: "(flat)" for n in nodes}, source="no topology")


def job_topology(spec_topology: str | None, slurm: TopologySource, nodes: Sequence[str]) -> tuple[Topology, str | None]:
    """The spec's topology file, else Slurm's; a flat one (with a warning) when Slurm has none."""
    from clusterctl.slurm.topology import load_topology, parse_scontrol_topology
    if spec_topology:
        return load_topology(Path(spec_topology)), None
    text = slurm.show_topology()
    if not text.strip():
        return flat_topology(nodes), "Slurm reports no topology (TopologyPlugin?): the map treats all nodes as one switch"
    return parse_scontrol_topology(text), None


def port_is_free(port: int) -> bool:
    """Nobody listens on TCP `port` here yet (probed by binding it, then letting it go)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def plan_for_job(run_dir: Path, job_dir: Path, environ: Mapping[str, str], slurm: TopologySource,
                 candidates: Sequence[str] | None = None, layout: ParallelLayout | None = None,
                 planned: PlannedMap | None = None) -> JobRankMap:
    """Compute and write the job's rank map; returns it.  `candidates`: the nodes of the allocation the map
    may take (default: all of them); the map records the whole allocation, the rest as its unused nodes.
    `layout`: the step's parallel layout when it is not the spec's (a job that shrank).  `planned`: a map
    already planned (a shrink's, by the recovery judge), taken when planned from the same inputs as this one."""
    # Imported here, not at the top: every rank runs this module (the `rank` step), and on a
    # node starting 8 ranks the planner's imports (rich among them) cost more than the check.
    from clusterctl.slurm import hostlist
    from clusterctl.launcher.pure.placement import plan_once
    from clusterctl.launcher.pure.plan_document import plan_json
    from clusterctl.launcher.shared.runs import RunDir
    spec = RunDir(run_dir).spec()
    job_id = environ.get("SLURM_JOB_ID", "0")
    allocated = hostlist.expand(environ["SLURM_JOB_NODELIST"])
    topology, warning = job_topology(spec.placement.topology, slurm, allocated)
    if warning:
        say(f"warning: {warning}")
    pool = [n for n in allocated if n in set(candidates)] if candidates is not None else allocated
    chosen = plan_once(layout or spec.parallel, spec.job.gpus_per_node, topology, pool, spec.placement.weight_map(),
                       planned)
    result = chosen.plan
    summary = result.summary()
    in_map = set(result.rank_map.slots)
    rank_map = JobRankMap(job_id, environ["SLURM_JOB_NODELIST"], result.rank_map,
                          master_port(spec.launch.master_port,
                                      free=port_is_free if result.rank_map.slots[0] == _node_name(environ)
                                      else lambda port: True),
                          tuple(n for n in allocated if n not in in_map), summary, plan_json(result, topology))
    (job_dir / "ranks").mkdir(parents=True, exist_ok=True)
    atomic_write(job_dir / "hostfile", "\n".join(hostfile_lines(rank_map, per_gpu=True)) + "\n")
    atomic_write(job_dir / "nodefile", "\n".join(hostfile_lines(rank_map, per_gpu=False)) + "\n")
    write_rank_index(job_dir, rank_map)
    path = write_rank_map(job_dir, rank_map)
    say(f"rank map for {environ['SLURM_JOB_NODELIST']}: node slots {hostlist.compress(list(rank_map.slots))} "
         f"in order {' '.join(rank_map.slots)}; leaf-crossing DP/PP groups {summary.leaf_crossing_groups} "
         f"(Slurm's order: {summary.slurm_order_leaf_crossing_groups}); {path}"
         f"{' (as the recovery judge planned it)' if chosen is planned else ''}")
    return rank_map


def _record(job_dir: Path, rank: int, node: str, environ: Mapping[str, str]) -> None:
    write_rank_record(job_dir, RankRecord(
        rank=rank, node=node, hostname=socket.gethostname(), pid=os.getpid(), local_rank=int(environ["LOCAL_RANK"]),
        started=time.time(), slurm_procid=environ.get("SLURM_PROCID"), slurm_localid=environ.get("SLURM_LOCALID"),
        slurm_nodeid=environ.get("SLURM_NODEID"), cuda_visible_devices=environ.get("CUDA_VISIBLE_DEVICES")))


def _load_slot(job_dir: Path, *, rank: int | None = None, node_rank: int | None = None) -> SlotView:
    try:
        return read_slot(job_dir, rank=rank, node_rank=node_rank)
    except FileNotFoundError:
        raise ClusterctlError(f"{rank_index_path(job_dir)} is missing: the job's `plan` step did not run or "
                              "failed; see the start of the job log") from None


def _node_name(environ: Mapping[str, str]) -> str:
    # SLURMD_NODENAME is Slurm's name for the node (what the map uses); the hostname may differ.
    return environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def exec_rank(job_dir: Path, command: Sequence[str], environ: Mapping[str, str], *, under_torchrun: bool) -> int:
    """Check this task against the map, record it, and exec the command (returns only on failure)."""
    node = _node_name(environ)
    local_id: int | None
    if under_torchrun:
        rank, local_id = int(environ["RANK"]), int(environ["LOCAL_RANK"])
    else:
        rank = int(environ["SLURM_PROCID"])
        local_id = int(environ["SLURM_LOCALID"]) if "SLURM_LOCALID" in environ else None
    rank_map = _load_slot(job_dir, rank=rank)
    problems = placement_problems(rank_map, rank, node, local_id, visible_gpus(environ))
    if problems:
        for problem in problems:
            say(f"preflight failed: {problem}")
        return EXIT_PREFLIGHT
    env = {**environ, **rank_environment(rank_map, rank), "CLUSTERCTL_JOB_DIR": str(job_dir)}
    # Under torchrun, the node's wrapper (`node`) has made the node dir and started the reporter.
    if not (under_torchrun and environ.get(NODE_DIR_ENV)):
        first_task = (environ.get("LOCAL_RANK") if under_torchrun else environ.get("SLURM_LOCALID")) == "0"
        env.update(prepare_node_reports(env, node, start_reporter=first_task))
    _record(job_dir, rank, node, env)
    return _exec(command, env)


def exec_node(job_dir: Path, command: Sequence[str], environ: Mapping[str, str]) -> int:
    """torchrun style: check this node's slot, then exec torchrun with the map's node rank."""
    node_rank = int(environ["SLURM_PROCID"])
    rank_map = _load_slot(job_dir, node_rank=node_rank)
    problems = node_problems(rank_map, node_rank, _node_name(environ))
    if problems:
        for problem in problems:
            say(f"preflight failed: {problem}")
        return EXIT_PREFLIGHT
    env = dict(environ)
    env.update(prepare_node_reports(env, _node_name(environ), start_reporter=True))
    return _exec(torchrun_argv(rank_map, node_rank, sys.executable, str(job_dir), command), env)


def prepare_node_reports(environ: Mapping[str, str], node: str, *, start_reporter: bool) -> dict[str, str]:
    """In an agent's step: the node-local directory for the program's environment, the reporter started.

    Returns the variables to add to the program's environment: {CLUSTERCTL_NODE_DIR: ...}, or
    nothing outside an agent's step (no report address and key) or when the directory or the
    reporter's settings are wrong (said in one warning line: the ranks then report to the job
    directory, and the rank runs all the same).  With `start_reporter` (the node's first task),
    the reporter is started detached, watching this process (the program, once exec'd).
    """
    if not (environ.get(REPORT_ADDR_ENV) and environ.get(REPORT_KEY_ENV)):
        return {}
    from clusterctl.launcher.job.reporter import report_settings
    try:
        report_settings(environ)  # a wrong setting is said here, in the job's log, by every task alike
        path = node_dir(environ.get("SLURM_JOB_ID", ""), environ.get(REPORT_LAUNCH_ENV, ""), node, environ)
        (path / "progress").mkdir(mode=0o700, exist_ok=True)
    except (ClusterctlError, OSError) as exc:
        say(f"warning: no node reports from {node}: {exc}; progress reports go to the job directory")
        return {}
    added = {NODE_DIR_ENV: str(path)}
    if start_reporter:
        try:
            start_node_reporter({**environ, **added}, os.getpid(), path / "reporter.log")
        except OSError as exc:
            say(f"warning: cannot start the node reporter on {node}: {exc}; progress reports go to the job "
                "directory")
            return {}
    return added


def start_node_reporter(env: Mapping[str, str], watch_pid: int, log: Path) -> None:
    """Start `python -m clusterctl.launcher.job reporter --watch-pid <watch_pid>` detached, and return at once.

    Double fork: the reporter is never a child of the program this process becomes (a program
    that waits for "any child", or counts SIGCHLDs, never meets it), in a session of its own
    (a terminal's ^C or a hang-up of the wrapper does not reach it), stdin and stdout on
    /dev/null, stderr appended to `log` (node-local: its lines do not reach the job's output).
    Slurm still ends it with the step (it stays in the step's cgroup).
    """
    argv = [sys.executable, "-m", "clusterctl.launcher.job", "reporter", "--watch-pid", str(watch_pid)]
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        err = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        os.close(devnull)
        raise
    try:
        child = os.fork()
        if child == 0:  # the forked child: it never returns
            try:
                os.setsid()
                if os.fork() == 0:
                    os.dup2(devnull, 0)
                    os.dup2(devnull, 1)
                    os.dup2(err, 2)
                    os.execve(argv[0], argv, dict(env))
            finally:
                os._exit(0)
    finally:
        os.close(devnull)
        os.close(err)
    _, status = os.waitpid(child, 0)
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        raise OSError(f"the reporter's starter ended with status {status}")


def _exec(command: Sequence[str], env: Mapping[str, str]) -> int:
    try:
        os.execvpe(command[0], list(command), dict(env))
    except OSError as exc:
        say(f"cannot run {command[0]!r}: {exc.strerror}")
        return 127
    return 127  # not reached
