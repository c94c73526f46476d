"""Turn a job spec into the exact sbatch argv and script (pure: no Slurm, no files).

The request is complete before anything runs, so `--dry-run` shows exactly what
`submit` would do (torchx's dry-run-first request objects; submitit's pure renderer).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from clusterctl import __version__
from clusterctl.errors import SpecError
from clusterctl.launcher.pure.parallel import DIMS, data_parallel_environment
from clusterctl.launcher.pure.shell import comment, quote, words
from clusterctl.launcher.pure.spec import JobSpec
from clusterctl.slurm import hostlist
from clusterctl.slurm.topology import Topology
from clusterctl.slurm.version import SlurmVersion

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_]+)\s*\}\}")


@dataclass(frozen=True)
class SlurmFacts:
    """What submit learned from the cluster once: release, topology plugin and tree (or blocks)."""

    version: SlurmVersion | None = None
    topology_plugin: str | None = None
    topology: Topology | None = None
    unreachable: str | None = None
    """Why Slurm could not be asked (one line), when it could not: nothing is known of its topology then."""


@dataclass(frozen=True)
class Template:
    """An sbatch template's text and where it came from (for error messages)."""

    text: str
    source: str


@dataclass(frozen=True)
class SubmitRequest:
    """Everything `sbatch` will be given: argv (script path last) and the script's text."""

    run_dir: str
    script_path: str
    script: str
    sbatch_argv: tuple[str, ...]
    warnings: tuple[str, ...]
    resume_from: str | None = None
    command: tuple[str, ...] = ()
    """What every rank runs (the in-job agent starts it; the script does not show it), resume arguments included."""


def fewest_leaves(topology: Topology, nodes: int, excluded: Collection[str] = ()) -> int | None:
    """The fewest leaf switches whose nodes, less `excluded`, add up to `nodes` (None if too few)."""
    usable = [leaf for node, leaf in topology.leaf_of.items() if node not in excluded]
    sizes = sorted((usable.count(name) for name in set(usable)), reverse=True)
    total = 0
    for count, size in enumerate(sizes, 1):
        total += size
        if total >= nodes:
            return count
    return None


def segment_request(nodes: int, facts: SlurmFacts) -> tuple[list[str], list[str]]:
    """`--segment` for a block topology: the largest segment that divides the node count and fits
    one base block (Slurm refuses a segment larger than a base block, or one that does not divide
    the job); the whole job in one block when it fits.  Only from 24.05, which has `--segment`."""
    release = facts.version
    if release is None or not release.segment:
        since = f"Slurm {release}" if release else "a Slurm of unknown release"
        return [], [f"topology/block on {since}: sbatch has no --segment before 24.05; no compact request"]
    block = facts.topology.block_size if facts.topology is not None else None
    if not block:
        return [], ["topology/block, but the block size could not be read from `scontrol show topology`; "
                    "no --segment request"]
    segment = max(size for size in range(1, min(block, nodes) + 1) if nodes % size == 0)
    if segment == 1 and nodes > 1:
        return [], [f"{nodes} nodes split into no segment larger than one node within {block}-node blocks; "
                    "no --segment request (choose a node count with a divisor up to the block size)"]
    return [f"--segment={segment}"], []


def compact_request(spec: JobSpec, facts: SlurmFacts, excluded: Collection[str] = ()) -> tuple[list[str], list[str]]:
    """sbatch options asking for a compact allocation, and warnings when it cannot be asked
    (`excluded`: nodes the job may not use; a resubmission without failed nodes may need more leaves)."""
    wanted = spec.placement.switches
    if wanted == 0:
        return [], []
    if facts.unreachable is not None:
        return [], [f"the topology could not be read: Slurm could not be reached ({facts.unreachable}); "
                    "no compact-allocation request"]
    nodes = spec.job.nodes + spec.job.spare_nodes
    wait = spec.placement.switch_wait
    plugin = facts.topology_plugin or ("topology/tree" if facts.topology is not None else None)
    if facts.topology is not None and facts.topology.kind == "block":
        plugin = "topology/block"  # what Slurm shows wins: with topology.yaml (25.05+) the plugin may read flat
    elif (facts.topology is not None and plugin == "topology/flat" and facts.version is not None
          and facts.version.topology_yaml):
        plugin = "topology/tree"  # a tree from topology.yaml, with TopologyPlugin left at its default
    if plugin == "topology/block":
        return segment_request(nodes, facts)
    if plugin != "topology/tree" or facts.topology is None:
        return [], ["Slurm has no tree topology here (TopologyPlugin is not topology/tree): "
                    "no --switches request; the rank map still follows whatever topology it can read"]
    if wanted == "auto":
        count = fewest_leaves(facts.topology, nodes, excluded)
        if count is None:
            return [], [f"the topology has fewer than {nodes} nodes in all; no --switches request"]
    else:
        count = int(wanted)
    return [f"--switches={count}@{wait}"], []


def launch_command(spec: JobSpec, run_dir: str, resume_from: str | None) -> list[str]:
    """What each rank runs: the spec's command with its placeholders filled, plus the resume arguments."""
    return _command(spec, run_dir, resume_from)


def _command(spec: JobSpec, run_dir: str, resume_from: str | None) -> list[str]:
    fills = {"{run_dir}": run_dir, "{checkpoint_dir}": spec.checkpoint_dir(run_dir) or ""}
    fills.update({f"{{{dim}}}": str(spec.parallel.size(dim)) for dim in DIMS})
    if spec.job.total_steps is not None:
        fills["{total_steps}"] = str(spec.job.total_steps)
    argv = []
    for arg in spec.launch.command:
        for placeholder, value in fills.items():
            arg = arg.replace(placeholder, value)
        argv.append(arg)
    if resume_from:
        argv += [arg.replace("{path}", resume_from) for arg in spec.checkpoint.resume_args]
    return argv


def _environment(spec: JobSpec, run_dir: str, resume_from: str | None) -> str:
    env = dict(spec.launch.env)
    if spec.launch.tp_comm_overlap and spec.parallel.tp > 1:
        # Megatron's TP communication overlap needs kernels queued in order on one connection; asked for by
        # name, never from the rank order (FSDP and torchtitan users have the default order too).
        env.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    if resume_from:
        env[spec.checkpoint.resume_env] = resume_from
    if spec.checkpoint.dir:
        env.setdefault("CLUSTERCTL_CHECKPOINT_DIR", spec.checkpoint_dir(run_dir) or "")
    for dim in DIMS:
        env.setdefault(f"CLUSTERCTL_{dim.upper()}", str(spec.parallel.size(dim)))
    for name, value in data_parallel_environment(spec.parallel.dp, spec.parallel.dp).items():
        env.setdefault(name, value)
    lines = [f"export {name}={quote(value)}" for name, value in env.items()]
    return "\n".join(lines) if lines else "# (no environment from the spec)"


def render_script(spec: JobSpec, template: Template, *, run_dir: str, python: str, attempt: int = 1,
                  resume_from: str | None = None) -> str:
    """The sbatch script: the template with every placeholder replaced by quoted values.

    `python` is the submitting side's interpreter; the spec's launch.python, when set, wins (the
    job runs the plan, the ranks' checks and the agent with it, on the compute nodes)."""
    header = ["# Values are single-quoted on purpose (literal text, never expanded):",
              "# shellcheck disable=SC2016,SC1003",
              f"# Rendered by clusterctl {__version__} from {comment(spec.source or 'a job spec')} "
              f"(attempt {attempt}; template {comment(Path(template.source).name)}).",
              "# sbatch options are on sbatch's command line; see run.json or `clusterctl submit --dry-run`."]
    if resume_from:
        header.append(f"# Resuming from {comment(resume_from)}.")
    values = {
        "header": "\n".join(header),
        "run_dir": quote(run_dir),
        "python": quote(spec.launch.python or python),
        "command": words(_command(spec, run_dir, resume_from)),
        "environment": _environment(spec, run_dir, resume_from),
        "nodes": str(spec.job.nodes),
        "world_size": str(spec.world_size),
        "gpus_per_node": str(spec.job.gpus_per_node),
        "resume_from": quote(resume_from or ""),
    }
    for number, line in enumerate(template.text.splitlines(), 1):
        for name in PLACEHOLDER.findall(line):
            if name not in values:
                raise SpecError(f"unknown placeholder {{{{{name}}}}}; known: "
                                + ", ".join("{{" + k + "}}" for k in values), path=f"{template.source}:{number}")
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], template.text)


def sbatch_argv(spec: JobSpec, facts: SlurmFacts, *, run_dir: str, script_path: str,
                exclude: str | None = None, no_requeue: bool = False,
                comment: str | None = None) -> tuple[list[str], list[str]]:
    """sbatch's argv (script path last) and the warnings about what could not be asked for."""
    job = spec.job
    ranks_per_task_node = job.gpus_per_node if spec.launch.style == "srun" else 1
    argv = ["sbatch", "--parsable", f"--job-name={job.name}", f"--nodes={job.nodes + job.spare_nodes}",
            f"--ntasks-per-node={ranks_per_task_node}", f"--gpus-per-node={job.gpus_per_node}",
            f"--output={run_dir}/logs/%j.out", f"--chdir={spec.launch.workdir}"]
    for option, value in (("--partition", job.partition), ("--account", job.account), ("--qos", job.qos),
                          ("--constraint", job.constraint), ("--time", job.time)):
        if value:
            argv.append(f"{option}={value}")
    excluded = ",".join(part for part in (job.exclude, exclude) if part)
    if excluded:
        argv.append(f"--exclude={excluded}")
    if spec.recovers_in_allocation:
        # A failed node must not end the allocation: the agent in the job gives it back and goes on on a spare.
        argv.append("--no-kill")
    if no_requeue:
        # The supervisor decides every resubmission itself; Slurm's own requeue after
        # NODE_FAIL (JobRequeue=1) would bring the attempt back behind its back.
        argv.append("--no-requeue")
    if comment:
        argv.append(f"--comment={comment}")  # lets a restarted supervisor find a job it submitted
    excluded_names = hostlist.expand(excluded) if excluded else []
    compact, warnings = compact_request(spec, facts, frozenset(excluded_names))
    argv += compact
    argv += list(job.sbatch_options)
    argv.append(script_path)
    return argv, warnings


def prepare(spec: JobSpec, template: Template, facts: SlurmFacts, *, run_dir: str, python: str, attempt: int = 1,
            resume_from: str | None = None, exclude: str | None = None, no_requeue: bool = False,
            comment: str | None = None) -> SubmitRequest:
    """The complete submission of one attempt, before anything is written or run."""
    script_path = f"{run_dir}/attempts/{attempt}/job.sbatch"
    script = render_script(spec, template, run_dir=run_dir, python=python, attempt=attempt, resume_from=resume_from)
    argv, warnings = sbatch_argv(spec, facts, run_dir=run_dir, script_path=script_path, exclude=exclude,
                                 no_requeue=no_requeue, comment=comment)
    if spec.recovers_in_allocation and not spec.runs_agent:
        warnings.append(f"spare_nodes with your own template ({spec.launch.template}): the allocation is kept "
                        "when a node fails (--no-kill), and only clusterctl's agent swaps a spare in; the "
                        "template must run `python -m clusterctl.launcher.job agent` as the built-in ones do, "
                        "or node failures are recovered by resubmission")
    return SubmitRequest(run_dir, script_path, script, tuple(argv), tuple(warnings), resume_from,
                         tuple(_command(spec, run_dir, resume_from)))
