"""Submitting an attempt: ask Slurm what it is once, render, write the script and the experiment record,
sbatch, journal."""

from __future__ import annotations

import errno
import importlib.resources
import os
import stat
from pathlib import Path

from clusterctl import __version__
from clusterctl.errors import SlurmCommandError, SpecError
from clusterctl.launcher.login.code_version import GitDoor, probe_code_version
from clusterctl.launcher.pure.render import SlurmFacts, SubmitRequest, Template
from clusterctl.launcher.pure.render import prepare as prepare_request
from clusterctl.launcher.shared.runs import RunDir, spec_document
from clusterctl.records.experiment_record import CodeVersion, ExperimentRecord, write_experiment_record
from clusterctl.records.run_journal import Submitted
from clusterctl.slurm.commands import Slurm
from clusterctl.launcher.pure.spec import JobSpec
from clusterctl.slurm.topology import Topology, load_topology, parse_scontrol_topology


def builtin_template(style: str) -> Template:
    """sbatch_templates/<style>.sbatch, read from the installed package (a wheel has no source tree)."""
    resource = importlib.resources.files("clusterctl.sbatch_templates").joinpath(f"{style}.sbatch")
    return Template(resource.read_text(encoding="utf-8"), f"sbatch_templates/{style}.sbatch")


def load_template(spec: JobSpec) -> Template:
    """The spec's own template, or the built-in one for its launch style."""
    if spec.launch.template:
        try:
            return Template(Path(spec.launch.template).read_text(encoding="utf-8"), spec.launch.template)
        except OSError as exc:
            raise SpecError(f"cannot read the template ({exc.strerror}); fix [launch] template",
                            path=spec.launch.template) from None
        except UnicodeDecodeError as exc:
            raise SpecError(f"the template is not UTF-8 text (byte {exc.start + 1}); an sbatch template is a "
                            "bash script", path=spec.launch.template) from None
    return builtin_template(spec.launch.style)


def check_workdir(spec: JobSpec) -> None:
    """The job's working directory exists (SpecError naming it otherwise): the login node sees the same shared
    filesystem as the compute nodes, where sbatch --chdir would otherwise fail only once the job starts."""
    workdir = spec.launch.workdir
    try:
        found = os.stat(workdir)
    except OSError as exc:
        why = "does not exist" if exc.errno == errno.ENOENT else f"cannot be reached ({exc.strerror})"
        raise SpecError(f"the directory the job runs in, {workdir}, {why}; create it, or fix launch.workdir "
                        "(a relative one is from the spec file's folder)", path=spec.source or None,
                        key="launch.workdir") from None
    if not stat.S_ISDIR(found.st_mode):
        raise SpecError(f"{workdir} is not a directory; launch.workdir is the directory the job runs in",
                        path=spec.source or None, key="launch.workdir")


def gather_facts(slurm: Slurm, spec: JobSpec) -> tuple[SlurmFacts, list[str]]:
    """Slurm's release, topology plugin and tree, asked once; what could not be learned becomes a warning."""
    warnings: list[str] = []
    try:
        version = slurm.release()
    except SlurmCommandError as exc:  # the compact request says so, in one line (render.compact_request)
        return SlurmFacts(unreachable=exc.brief), []
    plugin = None
    if version.topology_block:
        try:
            plugin = slurm.config_value("TopologyPlugin")
        except SlurmCommandError as exc:
            warnings.append(f"cannot read TopologyPlugin ({exc.brief})")
    topology: Topology | None
    try:
        if spec.placement.topology:
            topology = load_topology(Path(spec.placement.topology))
        else:
            text = slurm.show_topology()
            topology = parse_scontrol_topology(text) if text.strip() else None
    except SlurmCommandError as exc:
        return SlurmFacts(version, plugin, unreachable=exc.brief), warnings
    return SlurmFacts(version, plugin, topology), warnings


def experiment_record(spec: JobSpec, request: SubmitRequest, attempt: int, code: CodeVersion,
                      now: float) -> ExperimentRecord:
    """What attempt `attempt` runs: the spec it was rendered from (resolved, as spec.json holds it), the
    command every rank starts with, the workdir's code version, the data version label and this clusterctl."""
    return ExperimentRecord(attempt=attempt, recorded_at=now, clusterctl_version=__version__,
                            command=request.command, data_version=spec.job.data_version, code=code,
                            spec=spec_document(spec))


def submit_attempt(run: RunDir, spec: JobSpec, request: SubmitRequest, slurm: Slurm, attempt: int,
                   exclude: str | None, git: GitDoor) -> str:
    """Write the attempt's script and experiment record (the workdir's code version asked through `git`),
    sbatch it, journal it; the job id."""
    run.write_attempt_script(attempt, request.script)
    code = probe_code_version(spec.launch.workdir, git)
    write_experiment_record(run.attempt_dir(attempt), experiment_record(spec, request, attempt, code, run.now()))
    job_id = slurm.sbatch(list(request.sbatch_argv))
    run.record(Submitted(at=run.now(), attempt=attempt, job_id=job_id, argv=tuple(request.sbatch_argv),
                         resume_from=request.resume_from, exclude=exclude))
    return job_id


def prepare(spec: JobSpec, facts: SlurmFacts, *, run_dir: str, python: str, attempt: int = 1,
            resume_from: str | None = None, exclude: str | None = None, no_requeue: bool = False,
            comment: str | None = None) -> SubmitRequest:
    """The full request of one attempt (template read from disk, everything else pure)."""
    return prepare_request(spec, load_template(spec), facts, run_dir=run_dir, python=python, attempt=attempt,
                           resume_from=resume_from, exclude=exclude, no_requeue=no_requeue, comment=comment)
