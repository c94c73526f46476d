"""What the `clusterctl` commands do, without the command line: submit, wait, cancel, status, report, plan.

Each use case takes its doors (Slurm, the clock, sleeping) as arguments, so the command-line
module only parses options, calls one of these and prints the result.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol
from pathlib import Path

from clusterctl.errors import HostlistError, LayoutError, RunError, SlurmCommandError, SpecError
from clusterctl.launcher.shared.checkpoints import find_checkpoints
from clusterctl.launcher.pure.parallel import ParallelLayout, layout_from_mapping
from clusterctl.launcher.pure.render import SlurmFacts, SubmitRequest
from clusterctl.launcher.login.report import NOT_RECORDED, AttemptExperiment, AttemptNodes, RunReport, run_report
from clusterctl.launcher.login.report_drawing import RunSeries, run_series
from clusterctl.launcher.pure.training_curves import joined, thin_series
from clusterctl.launcher.shared.runs import (
    RunDir, attempts_of, check_new_run_path, create_run, find_run_of_job, list_runs, unique_run_path,
)
from clusterctl.launcher.pure.spec import JobSpec, default_runs_dir, fill_data_parallel, load_spec, parse_overrides
from clusterctl.launcher.pure.submit_defaults import defaults_files, merged_defaults
from clusterctl.launcher.login.status import CheckpointStatus, RunStatus, best_report, run_status
from clusterctl.launcher.login.status_reads import Looks, run_checkpoints, run_spec, slow_node_seconds
from clusterctl.launcher.pure.goodput import Goodput, run_goodput
from clusterctl.launcher.login.code_version import GitDoor, run_git
from clusterctl.launcher.login.submit import check_workdir, gather_facts, prepare, submit_attempt
from clusterctl.records.agent_summary import read_agent_summary
from clusterctl.records.experiment_record import experiment_record_path, read_experiment_record
from clusterctl.records.rank_map import read_rank_map
from clusterctl.records.node_step_times import NodeStepTimes, read_node_step_times
from clusterctl.records.run_journal import (
    Decided, EventKind, RecoveredInAllocation, RunEnded, RunEvent, SlurmTimes,
)
from clusterctl.records.training_series import TrainingPoint, TrainingSeriesReader, read_series_ends
from clusterctl.records.versioned import RecordError
from clusterctl.slurm import hostlist
from clusterctl.slurm.commands import Slurm
from clusterctl.slurm.names import is_job_id
from clusterctl.slurm.jobs import JobReport
from clusterctl.slurm.topology import Topology, load_nvlink_domains, load_topology, parse_scontrol_topology

PLAN_GPUS_PER_NODE = 8
"""`clusterctl plan`'s GPUs per node when neither --gpus-per-node nor a spec says."""


# ---- submit -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Submission:
    """A submission worked out before anything is written: the run directory, the request, what Slurm is."""

    spec: JobSpec
    run_path: Path
    request: SubmitRequest
    facts: SlurmFacts
    warnings: tuple[str, ...]


def prepare_submission(spec: JobSpec, slurm: Slurm, *, run_dir: Path | None, now: float, python: str,
                       resume_from: str | None, supervise: bool) -> Submission:
    """Ask Slurm what it is (once), choose the run directory and build the first attempt's request.

    Nothing is written and nothing submitted: `--dry-run` shows exactly this.
    """
    check_workdir(spec)
    facts, warnings = gather_facts(slurm, spec)
    root = Path(spec.job.runs_dir or default_runs_dir())
    path = (run_dir or unique_run_path(root, spec.job.name, now)).absolute()
    check_new_run_path(path)  # --dry-run says so too, before anything is written
    request = prepare(spec, facts, run_dir=str(path), python=python, resume_from=resume_from, no_requeue=supervise)
    return Submission(spec, path, request, facts, (*warnings, *request.warnings))


def create_submission_run(submission: Submission, spec_text: str) -> RunDir:
    """Write the run directory of a submission (spec, journal); RunError when it already exists."""
    return create_run(submission.run_path, submission.spec, spec_text)


def submit_first_attempt(run: RunDir, submission: Submission, slurm: Slurm, git: GitDoor = run_git) -> str:
    """sbatch the submission's request as attempt 1 (unsupervised), with its experiment record (the
    workdir's code version asked through `git`), and journal it; the job id.

    When sbatch refuses, the run directory just made for it is removed again: no run without a job.
    """
    try:
        return submit_attempt(run, submission.spec, submission.request, slurm, 1, None, git)
    except BaseException:
        if not run.attempts():
            shutil.rmtree(run.path, ignore_errors=True)
        raise


WAIT_MISSING_POLLS = 30
"""Polls in a row in which neither the controller nor accounting knows the job before wait gives up."""


def wait_for_job(slurm: Slurm, job_id: str, sleep: Callable[[float], None] = time.sleep,
                 poll: float = 1.0) -> JobReport:
    """Poll the controller (then accounting) until the job is terminal; Slurm's final report of it.

    The controller holds a finished job for MinJobAge, so this works without accounting; a job
    neither knows for WAIT_MISSING_POLLS polls in a row is a RunError (its end is unknown).
    """
    missing = 0
    while True:
        report = slurm.queue([job_id]).get(job_id)
        if report is None:
            report = slurm.accounting([job_id]).get(job_id)
        if report is not None and report.terminal:
            return report
        missing = missing + 1 if report is None else 0
        if missing >= WAIT_MISSING_POLLS:
            raise RunError(f"job {job_id} is known neither to slurmctld nor to accounting; its end is unknown "
                           "(see its log, and `sacct -j` if the cluster keeps accounting)")
        sleep(poll)


# ---- runs: find, cancel, status, report ---------------------------------------------------------
def resolve_runs(target: str | None, runs_root: Path,
                 say: Callable[[str], None] = lambda note: None) -> list[RunDir]:
    """The runs a command means: RUN (a directory), JOB (a job id one of this user's runs submitted),
    or this user's newest runs.

    Runs of other users in a shared runs directory are never looked up by job id or listed (notes
    through `say` name what was skipped); a RUN given by its path is taken as given (`cancel` then
    checks its owner).
    """
    if target is None:
        return list_runs(runs_root, say=say)
    candidate = Path(target)
    if candidate.is_dir():
        run = RunDir(candidate.absolute())
        if not run.exists():
            raise RunError(f"{candidate} is not a clusterctl run directory (no spec.json)")
        return [run]
    if is_job_id(target):
        found = find_run_of_job(runs_root, target, say=say)
        if found is None:
            raise RunError(f"no run of yours under {runs_root} submitted job {target}; pass the run directory instead")
        return [found]
    raise RunError(f"{target!r} is neither a run directory nor a job id")


def cancel_run(run: RunDir, slurm: Slurm) -> list[str]:
    """Journal the cancellation (its supervisor stops), then scancel the run's live jobs; their ids.

    Only the run's owner cancels through it (RunError otherwise): the jobs it cancels are the ones
    its journal lists, and a journal another user wrote could list any of this user's jobs.
    """
    run.check_owned()
    ids = [a.job_id for a in run.attempts()]
    queue = slurm.queue(ids) if ids else {}
    live = [job_id for job_id in ids if job_id in queue and not queue[job_id].terminal]
    run.record(RunEnded(kind=EventKind.CANCELLED, at=run.now(), message="cancelled by the user", jobs=tuple(live)))
    slurm.cancel(live)
    return live


class JobQueries(Protocol):
    """What status asks Slurm: the controller's view of some jobs, and accounting's (Slurm is one)."""

    def queue(self, job_ids: Sequence[str] = ()) -> dict[str, JobReport]: ...

    def accounting(self, job_ids: list[str]) -> dict[str, JobReport]: ...


def gather_status(runs: Sequence[RunDir], slurm: JobQueries, say: Callable[[str], None],
                  skip_damaged: bool = False, *, looks: dict[Path, Looks] | None = None,
                  now: float | None = None) -> list[RunStatus]:
    """The status of each run: its journal and rank maps joined with one squeue (and sacct for the rest).

    A rank map this clusterctl cannot read is shown as missing, with a note through `say`; a
    damaged journal line, with a warning saying what it may have cost.  With
    `skip_damaged` (listing every run), a run whose journal cannot be read is left out with a note
    instead of ending the listing, and an ended run's checkpoints and goodput are not read (`report`'s);
    without it, its RecordError is the answer.  `looks`: by run, what was read before and is read again only
    when it changed (the watch keeps them from one look to the next); `now`: the time of the look (goodput so
    far, ages; default the run's clock).
    """
    journals = {}
    for run in runs:
        try:
            journal = run.journal()
        except RecordError as exc:
            if not skip_damaged:
                raise
            say(f"note: skipping a run: {exc}")
            continue
        journals[run.path] = journal.events
        for warning in journal.warnings:
            say(f"warning: {run.journal_path}: {warning}")
    runs = [run for run in runs if run.path in journals]
    attempts = {path: attempts_of(events) for path, events in journals.items()}
    every = [a.job_id for run in runs for a in attempts[run.path]]
    try:
        queue = slurm.queue(every) if every else {}
        older = [job_id for job_id in every if job_id not in queue]  # past MinJobAge: only accounting has them
        accounting = slurm.accounting(older) if older else {}
    except SlurmCommandError as exc:
        # What an ended run's journal holds (each attempt's decided state and Slurm's times) is its status;
        # a run still going cannot be told without Slurm.
        if not all(any(isinstance(e, RunEnded) for e in journals[run.path]) for run in runs):
            raise
        say(f"note: Slurm could not be reached ({exc.brief}): shown from the journal of the ended run")
        queue, accounting = {}, {job: report for events in journals.values() for job, report in decided_reports(events).items()}
    statuses = []
    for run in runs:
        try:
            rank_maps = run.rank_maps([a.job_id for a in attempts[run.path]])
        except RecordError as exc:
            say(f"note: {exc}")
            rank_maps = {}
        step_times, agent = None, None
        if attempts[run.path]:
            job_dir = run.path / "jobs" / attempts[run.path][-1].job_id
            try:
                step_times = read_node_step_times(job_dir)
            except RecordError as exc:
                say(f"note: {exc}")
            try:
                agent = read_agent_summary(job_dir)
            except (RecordError, OSError) as exc:
                say(f"note: {exc}")
        events = journals[run.path]
        at = now if now is not None else run.now()
        progress = RunProgress()
        if not (skip_damaged and any(isinstance(e, RunEnded) for e in events)):
            run_looks = looks.setdefault(run.path, Looks()) if looks is not None else Looks()
            progress = run_progress(run, events, run_looks, queue, accounting, step_times, at, say)
        statuses.append(run_status(run.path, events, rank_maps, queue, accounting, step_times, agent,
                                   total_steps=progress.total_steps, checkpoint=progress.checkpoint,
                                   goodput=progress.goodput, looked_at=at))
    return statuses


def decided_reports(events: Sequence[RunEvent]) -> dict[str, JobReport]:
    """Each decided attempt's job as the supervisor journaled what Slurm said at its end (state, exit
    code, times; no nodes): a run's status when Slurm cannot be asked."""
    reports = {}
    for e in events:
        if isinstance(e, Decided) and e.job_id is not None:
            times = e.times or SlurmTimes()
            reports[e.job_id] = JobReport(e.job_id, "", e.state, "", "", e.exit_code, None, times.submit or 0.0,
                                          times.start or 0.0, times.end or 0.0, source="run journal")
    return reports


@dataclass(frozen=True)
class RunProgress:
    """How far a run got (each None: not known, or not read)."""

    total_steps: int | None = None
    checkpoint: CheckpointStatus | None = None
    goodput: Goodput | None = None


def run_progress(run: RunDir, events: Sequence[RunEvent], looks: Looks, queue: Mapping[str, JobReport],
                 accounting: Mapping[str, JobReport], step_times: NodeStepTimes | None, now: float,
                 say: Callable[[str], None]) -> RunProgress:
    """How far the run got, for `run_status`: the spec's total step count, the newest checkpoint (with tiers:
    where its parts are, the running job's nodes present) and the goodput so far (`report`'s account, with
    Slurm's times of the jobs no supervisor has decided on yet)."""
    spec = run_spec(looks, run, say)
    if spec is None:
        return RunProgress()
    jobs = [a.job_id for a in attempts_of(events)]
    latest = best_report(jobs[-1], queue, accounting) if jobs else None
    present = None
    if latest is not None and latest.state == "RUNNING" and latest.nodes:
        given_back = {node for e in events if isinstance(e, RecoveredInAllocation) and e.job_id == jobs[-1]
                      for node in e.given_back}
        try:
            present = [node for node in hostlist.expand(latest.nodes) if node not in given_back]
        except HostlistError:
            present = None
    checkpoints = run_checkpoints(looks, run, spec, jobs[-1] if jobs else None, present, say)
    decided = {e.job_id for e in events if isinstance(e, Decided) and e.job_id is not None}
    slurm_times = {job: SlurmTimes(r.submit_time or None, r.start_time or None, r.end_time or None)
                   for job in jobs if job not in decided and (r := best_report(job, queue, accounting)) is not None}
    slow = slow_node_seconds(looks, run, jobs[:-1]) + (step_times.lost_s if step_times is not None else 0.0)
    goodput = run_goodput(events, checkpoints.complete if checkpoints is not None else (), now, slow,
                          spec.checkpoint.tiers, slurm_times)
    return RunProgress(spec.job.total_steps, checkpoints.newest if checkpoints is not None else None, goodput)


def gather_report(run: RunDir, now: float) -> RunReport:
    """The report of a run: its journal and the checkpoints in its checkpoint directory."""
    spec = run.spec()
    directory = spec.checkpoint_dir(str(run.path))
    checkpoints, skipped = find_checkpoints(Path(directory), spec.checkpoint.recognised_by) if directory else ([], [])
    journal = run.journal()
    events = journal.events
    slow = sum(table.lost_s for table in step_time_tables(run, events))
    training, problems = training_ends(run, events)
    return run_report(run.path, events, checkpoints, skipped, now, slow, spec.restart.max_restarts,
                      journal_warnings=journal.warnings, tiers=spec.checkpoint.tiers,
                      experiment=read_experiments(run, sorted({a.number for a in attempts_of(events)})),
                      training=training, training_problems=problems, nodes=attempt_nodes(run, events))


def attempt_nodes(run: RunDir, events: Sequence[RunEvent]) -> dict[str, AttemptNodes]:
    """Where each of the run's jobs ran, by job id, from its rank map (a job that wrote none, or a damaged
    one, is left out: `status` names a damaged map; the report shows `-`)."""
    found = {}
    for attempt in attempts_of(events):
        try:
            rank_map = read_rank_map(run.job_dir(attempt.job_id))
        except (FileNotFoundError, RecordError):
            continue
        found[attempt.job_id] = AttemptNodes(tuple(rank_map.rank_map.slots), rank_map.unused_nodes)
    return found


def training_ends(run: RunDir, events: Sequence[RunEvent]) -> tuple[tuple[TrainingPoint, TrainingPoint] | None,
                                                                     list[str]]:
    """The first point of the run's first training series and the newest of its last (each job's series
    read at its two ends only: cheap whatever its length), and what could not be read."""
    ends: list[tuple[TrainingPoint, TrainingPoint]] = []
    problems = []
    for attempt in attempts_of(events):
        try:
            found = read_series_ends(run.job_dir(attempt.job_id))
        except RecordError as exc:
            problems.append(f"cannot read the training series of job {attempt.job_id}: {exc}")
            continue
        if found is not None:
            ends.append(found)
    return ((ends[0][0], ends[-1][1]) if ends else None), problems


def step_time_tables(run: RunDir, events: Sequence[RunEvent]) -> list[NodeStepTimes]:
    """The per-node step-time table of each of the run's jobs that has one, oldest job first (a damaged
    one is left out: `status` names it; the report counts and draws what it can read)."""
    tables = []
    for attempt in attempts_of(events):
        try:
            table = read_node_step_times(run.job_dir(attempt.job_id))
        except RecordError:
            table = None
        if table is not None:
            tables.append(table)
    return tables


def gather_drawing(run: RunDir, say: Callable[[str], None] = lambda note: None) -> RunSeries:
    """What `report --html` draws besides the report: each job's per-node step times, and the training
    curves of its jobs' series, each read whole and thinned (`training_curves.thin_series`: bounded memory,
    at most CURVE_LIMIT points a curve).  A series that cannot be read is left out, and said (on the page,
    and through `say`); so is a last line left out (a crash mid-append, or the line being written)."""
    events = run.journal().events
    curves, unread, notes = [], [], []
    for attempt in attempts_of(events):
        reader = TrainingSeriesReader(run.job_dir(attempt.job_id))
        try:
            curves.append(thin_series(reader))
        except RecordError as exc:
            unread.append(f"cannot read the training series of job {attempt.job_id}: {exc}; "
                          "its curves are left out")
            continue
        if reader.last_line_problem:
            notes.append(f"{reader.path}, line {reader.lines} (the last): {reader.last_line_problem}; left out")
    for note in (*unread, *notes):
        say(note)
    return run_series(joined(curves), step_time_tables(run, events), unread, notes)


def read_experiments(run: RunDir, attempts: Sequence[int]) -> list[AttemptExperiment]:
    """The experiment records of the run's `attempts`: each read, or why it could not be."""
    shown = []
    for number in attempts:
        folder = run.attempt_dir(number)
        try:
            record = read_experiment_record(folder)
        except (RecordError, OSError) as exc:
            shown.append(AttemptExperiment(number, experiment_record_path(folder), None, str(exc)))
            continue
        shown.append(AttemptExperiment(number, experiment_record_path(folder), record,
                                       NOT_RECORDED if record is None else None))
    return shown


# ---- plan ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlanInputs:
    """What `clusterctl plan` plans for: a layout, GPUs per node, a topology and the nodes to use."""

    layout: ParallelLayout
    gpus_per_node: int
    topology: Topology
    allocated: tuple[str, ...]


def plan_layout(spec_path: Path | None, options: Mapping[str, int | str], nodes: int,
                gpus_per_node: int | None) -> tuple[ParallelLayout, int]:
    """The layout to plan and GPUs per node: the spec's (read by the spec loader, for `nodes` nodes)
    with the command line's sizes on top; dp fills the rest when it is not given."""
    values: dict[str, int | str] = {}
    spec_dp: int | None = None
    if spec_path is not None:
        spec = load_spec(spec_path, parse_overrides(nodes=nodes, gpus_per_node=gpus_per_node))
        gpus_per_node = spec.job.gpus_per_node
        layout = spec.parallel
        values = {"tp": layout.tp, "pp": layout.pp, "cp": layout.cp, "ep": layout.ep, "order": layout.order}
        spec_dp = layout.dp
    gpus_per_node = gpus_per_node or PLAN_GPUS_PER_NODE
    values.update(options)
    if "dp" not in options:
        if spec_dp is not None and not {"tp", "cp", "pp"} & set(options):
            values["dp"] = spec_dp  # the spec loader already filled it for these nodes
        else:
            rest, dp = fill_data_parallel(values, nodes * gpus_per_node)
            if dp is None:
                raise LayoutError(f"tp×cp×pp = {rest} does not divide {nodes * gpus_per_node} GPUs ({nodes} nodes × "
                                  f"{gpus_per_node}); change tp, cp or pp, or the node count")
            values["dp"] = dp
    return layout_from_mapping(values, where=str(spec_path) if spec_path else "options"), gpus_per_node


def plan_inputs(slurm: Slurm, *, spec_path: Path | None, options: Mapping[str, int | str],
                gpus_per_node: int | None, topology_file: Path | None, nvlink_domains: Path | None,
                nodelist: str | None, node_count: int | None, partition: str | None) -> PlanInputs:
    """Everything `clusterctl plan` needs, from files or the live cluster.

    The topology comes from `topology_file`, else from Slurm (with `node_count`); the nodes from
    `nodelist` (N of them with `node_count`), else N idle nodes of the live cluster.  The caller
    makes sure one of each is given.
    """
    if topology_file is not None:
        topology = load_topology(topology_file)
    else:
        topology = parse_scontrol_topology(slurm.show_topology())
    if nvlink_domains is not None:
        topology = topology.with_nvlink_domains(load_nvlink_domains(nvlink_domains))
    if nodelist is not None:
        allocated = hostlist.expand(nodelist)
        wanted = node_count or len(allocated)  # with --nodes: use N of the listed nodes
    else:
        assert node_count is not None, "plan_inputs needs a nodelist or a node count"
        allocated = slurm.idle_nodes(partition)
        wanted = node_count
        if len(allocated) < node_count:
            raise LayoutError(f"--nodes {node_count}: only {len(allocated)} idle nodes now; ask for fewer nodes")
    layout, gpn = plan_layout(spec_path, options, wanted, gpus_per_node)
    return PlanInputs(layout, gpn, topology, tuple(allocated))


def read_submit_defaults(environ: Mapping[str, str], home: Path) -> tuple[tuple[str, str], ...]:
    """The site's and the user's [job] defaults (launcher/pure/submit_defaults.py); a missing file sets none."""
    found = []
    for path in defaults_files(environ, home):
        try:
            found.append((str(path), path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise SpecError(f"cannot read these submit defaults: {why}", path=str(path)) from None
    return merged_defaults(found)

