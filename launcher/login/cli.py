"""`clusterctl`: the command ML engineers run on a login node."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import stat
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.live import Live

from clusterctl import package_version
from clusterctl.errors import INTERNAL_ERROR_EXIT, ClusterctlError, OutputError, RunError
from clusterctl.files import atomic_write
from clusterctl.terminal_view import printable
from clusterctl.launcher.pure.cost import DEFAULT_WEIGHTS
from clusterctl.launcher.login.notify import webhook_notifier
from clusterctl.launcher.pure.parallel import DIMS
from clusterctl.launcher.pure.placement import plan as make_plan
from clusterctl.launcher.login.plan_view import plan_renderables, plan_svg
from clusterctl.launcher.pure.plan_document import plan_json
from clusterctl.launcher.pure.render import SlurmFacts
from clusterctl.launcher.login.report import report_renderables
from clusterctl.launcher.login.report_drawing import report_html
from clusterctl.launcher.shared.runs import RunDir
from clusterctl.launcher.shared.straggler_actions import srun_gpu_evidence
from clusterctl.launcher.pure.supervisor_job import LOG_NAME as SUPERVISOR_LOG, SCRIPT_NAME as SUPERVISOR_SCRIPT
from clusterctl.launcher.pure.supervisor_job import supervisor_job
from clusterctl.launcher.pure.spec_schema import spec_json_schema
from clusterctl.launcher.pure.spec import (
    MAX_NODES, MAX_RANKS, JobSpec, default_runs_dir, load_spec, parse_overrides, reference_rows,
)
from clusterctl.launcher.login.status import ended_how, status_renderables
from clusterctl.launcher.login.watch import (
    INTERVAL_S, MAX_INTERVAL_S, MIN_INTERVAL_S, RunFiles, SystemClock, skip_history, watch_run,
)
from clusterctl.launcher.login.watch_view import LineView, LiveView
from clusterctl.launcher.login.supervisor import Hooks, Supervisor, WatchSnapshot
from clusterctl.launcher.login.text_view import saying
from clusterctl.table_view import Column, TextTable
from clusterctl.terminal_view import plain, show, terminal
from clusterctl.launcher.login.use_cases import (
    cancel_run, create_submission_run, gather_drawing, gather_report, gather_status, plan_inputs, prepare_submission, resolve_runs,
    read_submit_defaults, submit_first_attempt, wait_for_job,
)
from clusterctl.records.versioned import indented_json
from clusterctl.slurm import hostlist
from clusterctl.slurm.commands import Slurm
from clusterctl.slurm.drains import SlurmDrains

DEFAULT_JOB_RECORDS = "/var/spool/clusterctl/job-health"
DETACH_GRACE = 2.0
"""Seconds `--detach` watches the background supervisor start before saying it supervises."""


class AsciiInt(click.IntRange):
    """A whole number written in ASCII digits: Python's int() also reads '١٢' and '1_000', sbatch does not."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not re.fullmatch(r"[+-]?[0-9]{1,18}", value.strip()):
            self.fail(f"{value!r} is not a whole number (ASCII digits)", param, ctx)
        return super().convert(value, param, ctx)

    def _describe_range(self) -> str:
        # click shows "x<=None" for a range with no maximum given: show only the bounds there are.
        if self.min is None and self.max is None:
            return ""
        return super()._describe_range()


SIZE = AsciiInt(1, MAX_RANKS)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_version(), prog_name="clusterctl")
@click.option("--debug", is_flag=True, help="Show a traceback with errors.")
def cli(debug: bool) -> None:
    """Keep large GPU training jobs running on Slurm.

    \b
    submit    render and submit a job spec (topology-aware script + rank map)
    supervise resubmit after node failures from the last complete checkpoint
    status    a run's attempts, nodes, rank-map cost and logs
    report    a run's blame, checkpoints, goodput and checkpoint advice (--html: drawn)
    cancel    cancel a run
    spec      the job-spec reference, or check a spec
    plan      plan a rank map without submitting
    hostlist  expand/compress Slurm hostlists

    \b
    Exit codes: 0 ok, 2 usage, 3 hostlist, 4 topology, 5 layout, 6 placement,
    7 spec, 8 Slurm command, 9 run directory, 10 a record file this version
    cannot read, 11 an unsafe directory, 12 a file that cannot be written,
    13 multi-level checkpoint settings a training program cannot use,
    14 a checkpoint copy that cannot move between nodes, 70 an internal error
    (please report it; --debug shows where), 130 interrupted.
    supervise: 0 done, 1 stopped, 2 cancelled.
    """
    if debug:
        os.environ["CLUSTERCTL_DEBUG"] = "1"


F = TypeVar("F", bound=Callable[..., Any])


def _records_option(f: F) -> F:
    return click.option("--job-records", type=click.Path(path_type=Path, file_okay=False),
                        default=lambda: os.environ.get("CLUSTERCTL_JOB_RECORDS", DEFAULT_JOB_RECORDS),
                        show_default="$CLUSTERCTL_JOB_RECORDS or " + DEFAULT_JOB_RECORDS,
                        help="Where the epilog writes per-job health records (healthd.toml job_records_dir).")(f)


def _common_overrides(f: F) -> F:
    for decorator in reversed((
        click.option("--nodes", type=AsciiInt(), help="Override job.nodes."),
        click.option("--gpus-per-node", type=AsciiInt(), help="Override job.gpus_per_node."),
        click.option("--time", "time_limit", help="Override job.time (Slurm format, e.g. 2:00:00)."),
        click.option("--partition", help="Override job.partition."),
        click.option("--account", help="Override job.account."),
        click.option("--qos", help="Override job.qos."),
        click.option("--name", help="Override job.name."),
        click.option("--exclude", help="Override job.exclude (a hostlist)."),
        click.option("-e", "--env", "env", multiple=True, metavar="NAME=VALUE", help="Add to [launch] env."),
        click.option("--sbatch-option", "sbatch_options", multiple=True, metavar="KEY=VALUE",
                     help="Add --KEY=VALUE (or --KEY) to sbatch's options, after job.sbatch_options; repeatable."),
    )):
        f = decorator(f)
    return f


def _load_spec_with(spec_file: Path, nodes: int | None, gpus_per_node: int | None, time_limit: str | None,
                    partition: str | None, account: str | None, qos: str | None, name: str | None,
                    exclude: str | None, env: tuple[str, ...], sbatch_options: tuple[str, ...]) -> JobSpec:
    """The spec with the site's and user's defaults under it and the command line over it."""
    overrides = parse_overrides(nodes=nodes, gpus_per_node=gpus_per_node, time=time_limit, partition=partition,
                                account=account, qos=qos, name=name, exclude=exclude, env=env,
                                sbatch_options=sbatch_options,
                                defaults=read_submit_defaults(os.environ, Path.home()))
    return load_spec(spec_file, overrides)


@cli.command()
@click.argument("spec_file", metavar="SPEC", type=click.Path(path_type=Path, dir_okay=False))
@_common_overrides
@click.option("--run-dir", type=click.Path(path_type=Path, file_okay=False),
              help="Run directory to create (default: <job.runs_dir>/<name>-<time>).")
@click.option("--resume", "resume_from", help="Start from this checkpoint (passed as [checkpoint] resume_env/args).")
@click.option("--dry-run", is_flag=True, help="Print the exact sbatch command and script; submit nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary.")
@click.option("--wait", is_flag=True, help="Wait for the job to end (like sbatch -W); exit 1 unless it completed.")
@click.option("--supervise", is_flag=True, help="Keep watching and resubmit after node failures (see `supervise`).")
@click.option("--detach", is_flag=True, help="With --supervise: supervise in the background (log in the run dir).")
@click.option("--in-slurm", is_flag=True, help="With --supervise: supervise from a small requeueable Slurm job "
                                                "(1 CPU), not this login node: it survives the login node.")
@_records_option
def submit(spec_file: Path, nodes: int | None, gpus_per_node: int | None, time_limit: str | None,
           partition: str | None, account: str | None, qos: str | None, name: str | None, exclude: str | None,
           env: tuple[str, ...], sbatch_options: tuple[str, ...], run_dir: Path | None, resume_from: str | None, dry_run: bool, as_json: bool, wait: bool,
           supervise: bool, detach: bool, in_slurm: bool, job_records: Path) -> None:
    """Submit the job described by SPEC (a TOML job spec; see `clusterctl spec`).

    \b
    Writes a run directory (spec, script, journal, logs), renders the sbatch script from
    sbatch_templates/, asks Slurm for a compact allocation, and submits.  In the job, the
    rank map is computed for the nodes Slurm gave and every rank checks it runs there.

    \b
    \b
    Defaults for job.account, partition, qos and constraint come from /etc/clusterctl/clusterctl.toml
    (the site's) and ~/.config/clusterctl/config.toml (yours; $XDG_CONFIG_HOME): the spec wins over
    them, the options here over the spec (docs/install.md#users).

    \b
    Examples:
      clusterctl submit job.toml --dry-run
      clusterctl submit job.toml --nodes 16 --time 4:00:00 -e NCCL_DEBUG=INFO
      clusterctl submit job.toml --qos high --sbatch-option mem=0 --sbatch-option exclusive
    """
    if (detach or in_slurm) and not supervise:
        raise click.UsageError(f"{'--detach' if detach else '--in-slurm'} only goes with --supervise")
    if detach and in_slurm:
        raise click.UsageError("--detach and --in-slurm are two ways to supervise without watching: pick one")
    if resume_from is not None and (not resume_from or any(ord(c) < 32 for c in resume_from)):
        raise click.BadParameter("expected a checkpoint path without control characters (newlines, tabs)",
                                 param_hint="--resume")
    if supervise and not dry_run:
        for flag, given in (("--resume", resume_from), ("--wait", wait), ("--json", as_json)):
            if given:
                raise click.UsageError(f"{flag} does not go with --supervise: the supervisor picks the newest "
                                       "complete checkpoint itself, waits until the run ends and logs as it goes")
    spec = _load_spec_with(spec_file, nodes, gpus_per_node, time_limit, partition, account, qos, name, exclude, env,
                           sbatch_options)
    slurm = Slurm()
    submission = prepare_submission(spec, slurm, run_dir=run_dir, now=time.time(), python=sys.executable,
                                    resume_from=resume_from, supervise=supervise)
    path, request, warnings = submission.run_path, submission.request, list(submission.warnings)
    for warning in warnings:
        click.echo(f"clusterctl: warning: {printable(warning)}", err=True)
    if dry_run:
        if as_json:
            click.echo(json.dumps({"dry_run": True, "run_dir": str(path), "sbatch_argv": list(request.sbatch_argv),
                                   "script": request.script, "command": list(request.command), "warnings": warnings},
                                  indent=2, sort_keys=True))
        else:
            click.echo(f"# would run: {shlex.join(request.sbatch_argv)}")
            command_line = printable(shlex.join(request.command)).replace("\n", "\\n")  # one line, whatever it holds
            click.echo(f"# every rank runs: {command_line}")
            click.echo(request.script, nl=False)
        return
    run = create_submission_run(submission, spec_file.read_text())
    if supervise:  # the supervisor submits every attempt itself (tagged, so a restart can find it)
        click.echo(f"run directory {path}")
        if in_slurm:
            sys.exit(_supervise_in_slurm(run, slurm, job_records))
        sys.exit(_start_supervisor(run, slurm, job_records, detach, submission.facts))
    job_id = submit_first_attempt(run, submission, slurm)
    if as_json:
        click.echo(json.dumps({"job_id": job_id, "run_dir": str(path), "sbatch_argv": list(request.sbatch_argv),
                               "log": str(run.log_path(job_id)), "warnings": warnings}, indent=2, sort_keys=True))
    else:
        click.echo(f"Submitted job {job_id}; run directory {path}")
        click.echo(f"  log:    {run.log_path(job_id)}")
        click.echo(f"  status: clusterctl status {path}")
    if wait:
        final = wait_for_job(slurm, job_id)
        console = terminal(stderr=True)
        for shown in gather_status([run], slurm, lambda note: console.print(plain(note))):
            show(console, status_renderables(shown))
        console.print(plain(f"job {job_id} ended {final.state}{ended_how(final)}"))
        if final.state != "COMPLETED":
            sys.exit(1)


def _supervise_in_slurm(run: RunDir, slurm: Slurm, job_records: Path) -> int:
    """Submit the run's supervisor as a small requeueable job (launcher/pure/supervisor_job.py)."""
    spec = run.spec()
    request = supervisor_job(str(run.path), sys.executable, str(job_records.absolute()),
                             partition=spec.job.partition, account=spec.job.account)
    atomic_write(run.path / SUPERVISOR_SCRIPT, request.script, mode=0o755)
    job_id = slurm.sbatch(list(request.argv))
    click.echo(f"supervising in Slurm job {job_id} (1 CPU; requeued when its node fails, restarted when "
               f"its process dies); log {run.path / SUPERVISOR_LOG}; watch with `clusterctl status {run.path}`")
    return 0


def _start_supervisor(run: RunDir, slurm: Slurm, job_records: Path, detach: bool,
                      facts: SlurmFacts | None = None) -> int:
    if detach:
        log = run.path / "supervisor.log"
        with open(log, "ab") as out:
            child = subprocess.Popen([sys.executable, "-c", "from clusterctl.launcher.login.cli import main; main()", "supervise",
                                      str(run.path), "--job-records", str(job_records)],
                                     stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        try:  # a supervisor that cannot start (a held lock, a damaged run) dies at once: say so, not "supervising"
            code = child.wait(timeout=DETACH_GRACE)
        except subprocess.TimeoutExpired:
            code = None
        if code is not None:
            lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
            if code == 0:  # nothing left to supervise (the run had already ended)
                click.echo(f"the supervisor finished at once: {lines[-1].strip() if lines else 'done'}; log {log}")
                return 0
            raise RunError(f"the background supervisor exited at once (exit {code}): "
                           f"{lines[-1].strip() if lines else 'no message'}; see {log}")
        click.echo(f"supervising in the background (pid {child.pid}); log {log}; "
                   f"re-attach with `clusterctl supervise {run.path}`")
        return 0
    console = terminal()
    spec = run.spec()
    say = saying(console, lambda: time.strftime("%H:%M:%S"))
    notifier = webhook_notifier(spec.restart.webhook, say)
    hooks = Hooks(say=say, notify=notifier, gpu_evidence=srun_gpu_evidence(spec.launch.python or sys.executable),
                  drain=SlurmDrains(runner=slurm.runner, timeout=slurm.timeout).drain)
    # `facts`: already asked of Slurm by `submit`; None makes the supervisor ask.
    supervisor = Supervisor(run, slurm, sys.executable, job_records, hooks, facts=facts)
    if not console.is_terminal:
        try:
            return supervisor.supervise()
        finally:
            notifier.drain()  # the last events (done, stopped) go out before the process ends
    with Live(console=console, auto_refresh=False, transient=True) as live:
        def show(snapshot: WatchSnapshot) -> None:
            live.update(plain(snapshot.line()), refresh=True)
        hooks.say = saying(live.console, lambda: time.strftime("%H:%M:%S"))
        hooks.show = show
        try:
            return supervisor.supervise()
        finally:
            notifier.drain()


@cli.command()
@click.argument("run_dir", metavar="RUN", type=click.Path(path_type=Path, file_okay=False))
@click.option("--detach", is_flag=True, help="Supervise in the background (log in RUN/supervisor.log).")
@click.option("--in-slurm", is_flag=True, help="Supervise from a small requeueable Slurm job (1 CPU), not this "
                                                "login node (log in RUN/supervisor-slurm.log).")
@_records_option
def supervise(run_dir: Path, detach: bool, in_slurm: bool, job_records: Path) -> None:
    """Supervise RUN: resubmit after node failures, from the last complete checkpoint,
    with the failed nodes excluded; stop on the program's own failures.

    \b
    Re-attach after the supervisor or the login session died: the journal in RUN says what
    was already done, and nothing is done twice.  Exit 0 when the run completed, 1 when it
    stopped (the reason is printed), 2 when it was cancelled.
    """
    run = RunDir(run_dir.absolute())
    if not run.exists():
        raise RunError(f"{run_dir} is not a clusterctl run directory (no spec.json); make one with "
                       "`clusterctl submit SPEC --supervise`")
    if detach and in_slurm:
        raise click.UsageError("--detach and --in-slurm are two ways to supervise without watching: pick one")
    if in_slurm:
        sys.exit(_supervise_in_slurm(run, Slurm(), job_records))
    sys.exit(_start_supervisor(run, Slurm(), job_records, detach))


def _write_drawing(option: str, path: Path, text: str) -> None:
    """Write a drawing to `path` whole (temp file and rename), never over anything but a regular file."""
    try:
        found = path.lstat()
    except OSError:
        found = None  # not there, or not reachable: writing it says why
    if found is not None and not stat.S_ISREG(found.st_mode):
        what = "a symlink" if stat.S_ISLNK(found.st_mode) else "something other than a regular file (a FIFO, a " \
            "device, a socket)"
        raise OutputError(f"{option} {path}: {what} is there, and only a regular file is replaced (clusterctl "
                          "neither writes through a link nor over a device); pick another path, or remove it first")
    try:
        atomic_write(path, text)
    except OSError as exc:
        raise OutputError(f"{option} {path}: cannot write it ({exc.strerror}); pick a path in a directory you "
                          "can write") from None


@cli.command()
@click.argument("run_dir", metavar="RUN", type=click.Path(path_type=Path, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--html", "html_file", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="Also draw the run to FILE: one HTML page (timeline, lost time, curves, step-time heat map) "
                   "that runs no script and fetches nothing.")
def report(run_dir: Path, as_json: bool, html_file: Path | None) -> None:
    """Report RUN: attempts, blamed nodes with evidence, checkpoints, goodput and the
    Young/Daly checkpoint-interval advice.

    \b
    Examples:
      clusterctl report RUN
      clusterctl report RUN --html run.html     # then open run.html in a browser
    """
    run = RunDir(run_dir.absolute())
    if not run.exists():
        raise RunError(f"{run_dir} is not a clusterctl run directory (no spec.json)")
    now = time.time()
    document = gather_report(run, now)
    if html_file is not None:
        drawing = gather_drawing(run, lambda note: click.echo(f"clusterctl: {printable(note)}", err=True))
        _write_drawing("--html", html_file, report_html(document, now, drawing))
        click.echo(f"clusterctl: drew the run to {printable(str(html_file))}", err=True)
    if as_json:
        click.echo(json.dumps(document.to_json(), indent=2, sort_keys=True))
    else:
        show(terminal(), report_renderables(document))


def _resolve_target(target: str | None) -> list[RunDir]:
    return resolve_runs(target, Path(default_runs_dir()), lambda note: click.echo(f"clusterctl: {printable(note)}", err=True))


@cli.command()
@click.argument("target", required=False, metavar="[RUN|JOB]")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (with --watch: one object per line).")
@click.option("--watch", is_flag=True, help="Show the run live until it ends (a terminal: redrawn; else a line "
              "per change).")
@click.option("--interval", type=click.FloatRange(MIN_INTERVAL_S, MAX_INTERVAL_S), default=INTERVAL_S,
              show_default=True, help="With --watch: seconds between two looks at the run's files.")
def status(target: str | None, as_json: bool, watch: bool, interval: float) -> None:
    """Show a run's attempts: state, nodes, rank-map cost and where the logs are.

    RUN is a run directory, JOB a Slurm job id; without either, the newest runs under
    $CLUSTERCTL_RUNS (default ~/.clusterctl/runs).  With --watch (one RUN or JOB), the run live
    until it ends: exit 0 when it is done, 1 when it ended otherwise, 130 on Ctrl-C.
    """
    if watch:
        if target is None:
            raise click.UsageError("--watch needs one RUN or JOB")
        sys.exit(_watch(_resolve_target(target)[0], as_json, interval))
    runs = _resolve_target(target)
    statuses = gather_status(runs, Slurm(), lambda note: click.echo(f"clusterctl: {printable(note)}", err=True),
                             skip_damaged=target is None)
    if as_json:
        shown = [s.to_json() for s in statuses] if target is None else statuses[0].to_json()
        click.echo(json.dumps(shown, indent=2, sort_keys=True))
        return
    if not statuses:
        click.echo(f"no runs under {default_runs_dir()}")
    console = terminal()
    for s in statuses:
        show(console, status_renderables(s))


def _watch(run: RunDir, as_json: bool, interval: float) -> int:
    """Watch `run` (launcher/login/watch.py): rich Live on a terminal, lines elsewhere."""
    reads = RunFiles(run, Slurm(), lambda note: click.echo(f"clusterctl: {printable(note)}", err=True))
    skip_history(reads)
    supervised = (run.path / ".lock").exists  # a supervisor journals the run's end
    console = terminal()
    if console.is_terminal and not as_json:
        with Live(console=console, auto_refresh=False, transient=False) as live:
            view = LiveView(lambda shown: live.update(shown, refresh=True))
            return watch_run(reads, view, SystemClock(), interval, supervised)

    def write(line: str) -> None:
        print(line, flush=True)
    return watch_run(reads, LineView(write, as_json), SystemClock(), interval, supervised)


@cli.command()
@click.argument("target", metavar="RUN|JOB")
def cancel(target: str) -> None:
    """Cancel a run's live attempt (scancel) and tell its supervisor to stop."""
    run = _resolve_target(target)[0]
    live = cancel_run(run, Slurm())
    click.echo(f"cancelled {', '.join(live) if live else 'no live job'}; run {run.path}")


@cli.command("spec")
@click.argument("spec_file", required=False, metavar="[SPEC]", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--markdown", is_flag=True, help="Print the reference as a Markdown table.")
@click.option("--json-schema", "json_schema", is_flag=True,
              help="Print the spec's JSON Schema (draft 2020-12) for an editor: Taplo's `#:schema` (docs/spec.md).")
def spec_command(spec_file: Path | None, markdown: bool, json_schema: bool) -> None:
    """Print the job-spec reference, or check SPEC and print it as clusterctl reads it."""
    if markdown and json_schema:
        raise click.UsageError("--markdown and --json-schema print the reference two ways: give one")
    if spec_file is not None:
        if markdown or json_schema:
            flag = "--markdown" if markdown else "--json-schema"
            raise click.UsageError(f"{flag} prints the reference, not a spec: drop SPEC or {flag}")
        click.echo(json.dumps(load_spec(spec_file).to_dict(), indent=2, sort_keys=True))
        return
    if json_schema:
        click.echo(json.dumps(spec_json_schema(), indent=2, ensure_ascii=False))
        return
    rows = reference_rows()
    if markdown:
        click.echo("| key | type | default | meaning |\n|---|---|---|---|")
        for key, kind, default, doc in rows:
            kind, default, doc = (cell.replace("|", "\\|") for cell in (kind, default, doc))
            click.echo(f"| `{key}` | {kind} | {default} | {doc} |")
        return
    show(terminal(), TextTable(
        (Column("key", bare=True), Column("type", max_width=14), Column("default", max_width=12), Column("meaning", prose=True)),
        tuple(rows), title="clusterctl job spec (TOML); `clusterctl spec --markdown` for docs/spec.md"))


@cli.group("hostlist")
def hostlist_group() -> None:
    """Expand or compress Slurm hostlists, exactly as `scontrol show hostnames/hostlist`."""


@hostlist_group.command("expand")
@click.argument("expression")
def hostlist_expand(expression: str) -> None:
    """Print every host of EXPRESSION (e.g. 'node[01-04],gpu7'), one a line."""
    click.echo("\n".join(hostlist.expand(expression)))


@hostlist_group.command("compress")
@click.argument("names", nargs=-1, required=True)
def hostlist_compress(names: tuple[str, ...]) -> None:
    """Print NAMES as one hostlist expression (order and duplicates kept, as Slurm does)."""
    click.echo(hostlist.compress(names))


def _weights(items: tuple[str, ...]) -> dict[str, float]:
    weights = dict(DEFAULT_WEIGHTS)
    for item in items:
        kind, sep, value = item.partition("=")
        try:
            if not sep or kind not in DIMS:
                raise ValueError
            weights[kind] = float(value)
            if not math.isfinite(weights[kind]) or not 0 <= weights[kind] <= 1e6:
                raise ValueError
        except ValueError:
            raise click.BadParameter(f"{item!r}: expected KIND=NUMBER with KIND one of {', '.join(DIMS)} and "
                                     "NUMBER from 0 to 1e6",
                                     param_hint="--weight") from None
    return weights


@cli.command()
@click.option("--spec", type=click.Path(path_type=Path, dir_okay=False),
              help="Plan a job spec's [parallel] layout and gpus_per_node (options below override it).")
@click.option("--tp", type=SIZE, help="Tensor-parallel size.")
@click.option("--pp", type=SIZE, help="Pipeline-parallel size.")
@click.option("--dp", type=SIZE, help="Data-parallel size (default: whatever fills the nodes).")
@click.option("--cp", type=SIZE, help="Context-parallel size.")
@click.option("--ep", type=SIZE, help="Expert-parallel size.")
@click.option("--order", help="Framework (megatron, megatron-tp-pp-dp, torchtitan) or an order like tp-pp-dp.")
@click.option("--gpus-per-node", type=AsciiInt(1, 128), help="GPUs per node (default: the spec's, else 8).")
@click.option("--topology", "topology_file", type=click.Path(path_type=Path, dir_okay=False),
              help="topology.conf, saved `scontrol show topology` output, or SLURM_TOPOLOGY_ADDR lines.")
@click.option("--nvlink-domains", type=click.Path(path_type=Path, dir_okay=False),
              help="TOML with [[domain]] name/nodes for NVLink domains larger than a node.")
@click.option("--nodelist", help="The allocated nodes as a hostlist (e.g. 'node[1-3,7]').")
@click.option("--nodes", "node_count", type=AsciiInt(1, MAX_NODES),
              help="Plan for N nodes: N of --nodelist, or of the live cluster's idle nodes without it.")
@click.option("--partition", help="With --nodes: only this partition's idle nodes.")
@click.option("--weight", multiple=True, metavar="KIND=W", help="Traffic weight of a group kind (default "
              + ", ".join(f"{k}={v:g}" for k, v in DEFAULT_WEIGHTS.items()) + ").")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--svg", type=click.Path(path_type=Path, dir_okay=False), help="Also draw the placement to FILE.")
@click.option("--explain", is_flag=True, help="Say why each leaf got what it got.")
def plan(spec: Path | None, tp: int | None, pp: int | None, dp: int | None, cp: int | None, ep: int | None,
         order: str | None, gpus_per_node: int | None, topology_file: Path | None, nvlink_domains: Path | None,
         nodelist: str | None, node_count: int | None, partition: str | None, weight: tuple[str, ...],
         as_json: bool, svg: Path | None, explain: bool) -> None:
    """Plan a topology-aware rank map and report its network cost against Slurm's and a
    depth-first order.

    \b
    Examples:
      clusterctl plan --tp 8 --pp 2 --topology topology.conf --nodelist 'node[1-4]'
      clusterctl plan --spec job.toml --nodes 16 --explain      # live cluster
    """
    options = {key: value for key, value in (("tp", tp), ("pp", pp), ("dp", dp), ("cp", cp), ("ep", ep),
                                             ("order", order)) if value is not None}
    if gpus_per_node is not None and gpus_per_node < 1:
        raise click.BadParameter("must be at least 1", param_hint="--gpus-per-node")
    if topology_file is None and node_count is None:
        raise click.UsageError("say where the topology comes from: --topology FILE (or --nodes N on a live cluster)")
    if nodelist is None and node_count is None:
        raise click.UsageError("say which nodes: --nodelist EXPR or --nodes N")
    inputs = plan_inputs(Slurm(), spec_path=spec, options=options, gpus_per_node=gpus_per_node,
                         topology_file=topology_file, nvlink_domains=nvlink_domains, nodelist=nodelist,
                         node_count=node_count, partition=partition)
    topology = inputs.topology
    result = make_plan(inputs.layout, inputs.gpus_per_node, topology, inputs.allocated, _weights(weight))
    if svg is not None:
        try:
            atomic_write(svg, plan_svg(result, topology))
        except OSError as exc:
            raise OutputError(f"--svg {svg}: cannot write it ({exc.strerror}); pick a path in a directory you "
                              "can write") from None
    if as_json:
        click.echo(indented_json(plan_json(result, topology)))
    else:
        show(terminal(), plan_renderables(result, topology, explain=explain))


def main() -> None:
    try:
        cli(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except ClusterctlError as exc:
        if os.environ.get("CLUSTERCTL_DEBUG"):
            traceback.print_exc()
        click.echo(f"clusterctl: error: {printable(str(exc))}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - the edge: a bug is one line and its own exit code, not a traceback
        if os.environ.get("CLUSTERCTL_DEBUG"):
            traceback.print_exc()
        first = str(exc).splitlines()[0][:300] if str(exc) else ""
        click.echo(f"clusterctl: internal error: {type(exc).__name__}: {printable(first)} (a bug: please report it with the "
                   "output of the same command with --debug)", err=True)
        sys.exit(INTERNAL_ERROR_EXIT)
