"""`healthd`: the GPU node health daemon (admins run it as a systemd service)."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

import click
from rich.console import Group, RenderableType
from rich.text import Text

from clusterctl import package_version
from clusterctl.errors import ClusterctlError
from clusterctl.healthd.config import DEFAULT_PATH as DEFAULT_CONFIG, ConfigError, HealthdConfig, load_config
from clusterctl.healthd.findings import Action
from clusterctl.healthd.policy import POLICY_VERSION, policy_rows
from clusterctl.table_view import Column, TextTable
from clusterctl.terminal_view import plain, show, terminal
from clusterctl.text import one_line

EXIT_CONFIG = ConfigError.exit_code  # 78, EX_CONFIG
EXIT_NO_STATE = 3
EXIT_NO_NVML = 4
EXIT_PROOF_FAILED = 1
EXIT_NOT_PROVEN = 6


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps({"ts": round(record.created, 3), "level": record.levelname.lower(),
                           "msg": record.getMessage(), "logger": record.name})


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_version(), prog_name="healthd")
def cli() -> None:
    """Watch this node's GPUs through NVML and drain the node in Slurm when one breaks.

    \b
    healthd run       the daemon (NVML events, kernel log, periodic checks)
    healthd status    the current verdict per GPU, from the state file (instant)
    healthd policy    the fault policy table
    healthd breaker   who holds the breaker's drain slots (with breaker_dir)
    healthd evidence  what the GPUs say now: clocks, slowdown reasons, temperature, ECC
    healthd install   print or write the systemd unit and the example config (docs/install.md)
    healthd prove     prove a repaired node with a known-good neighbour (a 2-node Slurm job)
    Config: /etc/clusterctl/healthd.toml (see healthd/healthd.example.toml).
    Exit codes: 78 a bad config (EX_CONFIG); 3 no fresh state (status) or no breaker_dir (breaker);
    4 NVML unusable (evidence); 5 GPUs expected here but not checked, NVML unusable (check);
    73 a file `install --prefix` would replace or cannot write (EX_CANTCREAT).
    """


def _config(path: Path | None) -> HealthdConfig:
    try:
        return load_config(path)
    except ConfigError as exc:
        click.echo(f"healthd: error: {one_line(str(exc))}", err=True)
        sys.exit(EXIT_CONFIG)


@cli.command()
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False),
              help="healthd.toml (default /etc/clusterctl/healthd.toml if it exists).")
@click.option("--dry-run", is_flag=True, help="Decide and log, but change nothing in Slurm.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def run(config_path: Path | None, dry_run: bool, log_format: str, verbose: bool) -> None:
    """Run the daemon in the foreground (logs to stdout, for journald). SIGHUP reloads the config."""
    from dataclasses import replace

    from clusterctl.healthd.daemon import Daemon

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_JsonFormatter() if log_format == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler], force=True)
    config = _config(config_path)
    if dry_run:
        config = replace(config, dry_run=True)
    sys.exit(Daemon(config, config_path=config_path).run())


@cli.command()
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the state file as JSON.")
def status(config_path: Path | None, as_json: bool) -> None:
    """The current verdict per GPU, from healthd's state file (never touches NVML).

    Exit 3 when there is no state, or when it is stale (healthd stopped writing it): then the text says
    "stale" first and the JSON carries `"stale": true` and its `age_seconds`."""
    from clusterctl.healthd.gate import read_state, state_is_fresh

    config = _config(config_path)
    state, unusable = read_state(config)
    if unusable:
        click.echo(f"healthd: error: {one_line(unusable)}", err=True)
        sys.exit(EXIT_NO_STATE)
    if state is None:
        click.echo(f"healthd: no state in {one_line(str(config.state_dir))}: is healthd running on this node?", err=True)
        sys.exit(EXIT_NO_STATE)
    now = time.time()
    age = now - state.updated_at
    fresh = state_is_fresh(state, config, now)
    if as_json:
        # The state file as written, and whether it still holds: a stale one exits 3 as the text form does.
        document = {**state.to_json(), "stale": not fresh, "age_seconds": round(age, 1)}
        click.echo(json.dumps(document, indent=2, sort_keys=True))
        sys.exit(0 if fresh else EXIT_NO_STATE)
    parts: list[RenderableType] = []
    if not fresh:
        parts.append(Text.assemble(("stale", "red"), f": healthd (pid {state.pid}) is not running or stopped writing "
                                   f"{age:.0f} s ago; what follows is its last word"))

    def shown(action: Action) -> str:
        return "healthy" if action is Action.IGNORE else action.label

    parts.append(Text.assemble(plain(state.node, "bold"), ": verdict ", (shown(state.verdict), "bold"),
                               plain(f", NVML {'ok' if state.nvml_ok else 'unavailable'}, "
                                     f"updated {age:.1f} s ago, policy {state.policy_version}"),
                               (" (dry run)" if state.dry_run else "", "yellow")))
    rows = tuple((str(gpu.index), gpu.uuid, shown(gpu.verdict),
                  "; ".join(f"{f.what} ({f.action.label}) {f.at}" for f in gpu.findings) or "none") for gpu in state.gpus)
    parts.append(TextTable((Column("GPU"), Column("UUID"), Column("verdict"), Column("findings", prose=True)), rows))
    for finding in state.node_findings:
        parts.append(plain(f"node: {finding.what} ({finding.action.label}): {finding.detail or finding.reason}"))
    for alert in state.alerts:
        parts.append(Text.assemble(("alert", "red"), plain(f" {alert.at}: {alert.detail}")))
    if state.return_note:
        parts.append(plain(f"return to service: {state.return_note}"))
    if state.pending_actions:
        parts.append(plain(f"{state.pending_actions} Slurm action(s) pending (slurmctld unreachable?)"))
    show(terminal(), Group(*parts))
    if not fresh:
        sys.exit(EXIT_NO_STATE)


@cli.command()
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False),
              help="healthd.toml (default /etc/clusterctl/healthd.toml if it exists).")
def check(config_path: Path | None) -> None:
    """A quick node check for Slurm's HealthCheckProgram (drains on a blocking verdict).

    \b
    Exit 0: healthy, or a blocking problem handed to the drain door (the line says what it did);
    5: this node should have GPUs (healthd.toml gpus_expected; "auto": NVIDIA GPUs on the PCI bus) and
    NVML cannot judge them (library not found, init error): not called healthy. A node without GPUs is
    healthy without NVML. 78: a bad --config.
    """
    from clusterctl.healthd.healthcheck import run_health_check

    if config_path is not None:
        _config(config_path)  # a bad file named on the command line is an error here, not the hooks' defaults
    sys.exit(run_health_check(dict(os.environ), config_path=config_path))


@cli.command()
@click.option("--json", "as_json", is_flag=True)
def policy(as_json: bool) -> None:
    """Print the fault policy table (signal → action) and its version."""
    rows = policy_rows()
    if as_json:
        click.echo(json.dumps({"version": POLICY_VERSION, "rules": [
            {"signal": s, "action": a, "meaning": m} for s, a, m in rows]}, indent=2))
        return
    show(terminal(), TextTable((Column("signal", bare=True, max_width=24), Column("action"), Column("meaning", prose=True)),
                               tuple(rows), title=f"healthd policy {POLICY_VERSION}"))


@cli.command()
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--partition", default="", help="Partition (default: healthd.toml's, else this node's first).")
@click.option("--json", "as_json", is_flag=True)
def breaker(config_path: Path | None, partition: str, as_json: bool) -> None:
    """Who holds the breaker's drain slots of a partition (the shared ledger under breaker_dir).

    A slot held by a node that is back in service is given back by that node's healthd at its
    next read of the node; a slot of a node whose healthd is gone stays until removed by hand
    (both of its names: slot-<i> and node-<node>).
    """
    from clusterctl.healthd.breaker_ledger import BreakerLedger
    from clusterctl.slurm.nodes import SlurmNode

    config = _config(config_path)
    if config.breaker_dir is None:
        click.echo("healthd: no breaker_dir in the config: each drain counts the partition through Slurm", err=True)
        sys.exit(EXIT_NO_STATE)
    if not partition:
        partition = config.partition
    try:
        if not partition:
            node = SlurmNode(config.node_name).state()
            partition = node.partitions[0] if node.partitions else ""
        slots, problems = BreakerLedger(config.breaker_dir, config.node_name, now=time.time).slots(partition)
    except (ClusterctlError, OSError) as exc:  # LEDGER_ERRORS: both kinds
        click.echo(f"healthd: error: {one_line(str(exc))}", err=True)
        sys.exit(getattr(exc, "exit_code", 1))
    if as_json:
        click.echo(json.dumps({"partition": partition, "slots": [s.to_json() for s in slots],
                               "unreadable": problems}, indent=2))
        return
    show(terminal(), TextTable(
        (Column("slot", bare=True), Column("node"), Column("since (UTC)", max_width=10), Column("reason", prose=True)),
        tuple((slot.name, slot.node, time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(slot.at)), slot.reason)
              for slot in slots),
        title=f"breaker slots of {partition} in {config.breaker_dir}"))
    for problem in problems:
        click.echo(f"healthd: unreadable slot: {one_line(problem)}", err=True)


@cli.command()
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False),
              help="healthd.toml (default /etc/clusterctl/healthd.toml if it exists): node name, state_dir, "
                   "nvml_timeout.")
@click.option("--gpus", default=None, metavar="0,3", help="Only these GPU indexes (default: every GPU).")
@click.option("--job-gpus", "step_gpus", is_flag=True,
              help="Only the GPUs this job step has on this node (SLURM_STEP_GPUS, set by Slurm in each step); "
                   "none, with a problem line, when it names none. What a job's straggler action reads.")
@click.option("--json", "as_json", is_flag=True, help="Print the gpu-evidence record as one line of JSON.")
def evidence(config_path: Path | None, gpus: str | None, step_gpus: bool, as_json: bool) -> None:
    """What this node's GPUs say now: clocks, slowdown reasons, temperature, ECC.

    Per GPU: the SM clock against its maximum, NVML's clock event reasons (HW slowdown, thermal,
    power brake...), temperature, volatile ECC counts, a pending row remap, and healthd's current
    findings (from its state file, when healthd runs here), then which GPUs the hardware says are
    slowed.  clusterctl's straggler watch runs it on a slow node (a one-off `srun` step, as the
    job's user, with --job-gpus: another job's GPUs on a shared node are neither shown nor counted)
    and drains the node only when this evidence explains the slowdown.  The record says which GPUs
    were read and why.

    \b
    Reads only (NVML and healthd's state file): any user may run it.
    Exit 0 when it printed evidence (what it could not read is listed as problems),
    4 when NVML cannot be used at all, 2 for a bad --gpus (or both --gpus and --job-gpus), 78 for a bad
    config.
    A SLURM_STEP_GPUS that is not a GPU list is a problem line of the record (exit 0), not an error.
    """
    from clusterctl.healthd.evidence import EVERY_GPU, chosen_gpus, job_gpus, read_evidence
    from clusterctl.healthd.gate import gpu_index_list
    from clusterctl.healthd.nvml import Nvml, NvmlError, NvmlHang, TimedCalls

    scope = EVERY_GPU
    if gpus is not None and step_gpus:
        click.echo("healthd: error: give --gpus or --job-gpus, not both", err=True)
        sys.exit(2)
    if gpus is not None:
        try:
            scope = chosen_gpus(gpu_index_list(gpus))
        except ValueError as exc:
            click.echo(f"healthd: error: --gpus: {exc}", err=True)
            sys.exit(2)
    elif step_gpus:
        scope = job_gpus(os.environ)
    config = _config(config_path)
    # One hung call is enough: the step must answer within the agent's wait, not once per GPU.
    nvml = Nvml(TimedCalls(config.nvml_timeout, max_abandoned=1))
    try:
        record = read_evidence(nvml, config, time.time(), scope)
    except (NvmlError, NvmlHang) as exc:
        click.echo(f"healthd: error: cannot read the GPUs through NVML: {one_line(str(exc))}", err=True)
        sys.exit(EXIT_NO_NVML)
    if as_json:
        click.echo(json.dumps(record.to_json(), sort_keys=True))
        return
    for line in record.to_text():
        click.echo(one_line(line))


@cli.command()
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False),
              help="The healthd.toml the unit runs with (default /etc/clusterctl/healthd.toml): its state_dir, "
                   "journal_dir and breaker_dir become the unit's ReadWritePaths.")
@click.option("--print-unit", is_flag=True, help="Print the systemd unit for this node.")
@click.option("--print-config", is_flag=True, help="Print the example healthd.toml (every key, its default).")
@click.option("--prefix", type=click.Path(path_type=Path, file_okay=False),
              help="Write the unit to PREFIX/etc/systemd/system/healthd.service and the example config to "
                   "PREFIX/etc/clusterctl/healthd.toml (`--prefix /` installs on this machine).")
@click.option("--force", is_flag=True, help="With --prefix: replace files that already exist.")
@click.option("--healthd", "healthd_path", type=click.Path(path_type=Path, dir_okay=False),
              help="The healthd the unit starts (default: this one, the healthd on PATH).")
def install(config_path: Path | None, print_unit: bool, print_config: bool, prefix: Path | None, force: bool,
            healthd_path: Path | None) -> None:
    """Print or write healthd's systemd unit and example config, out of the installed package.

    \b
    The unit starts the installed healthd with --config, and its ReadWritePaths hold every
    directory that config makes healthd write (ProtectSystem=strict leaves the rest read-only).
    With --prefix, an existing file is never replaced without --force, and each file is written
    whole or not at all.  Exit 73 when a file exists or cannot be written, 78 for a bad config.

    \b
    Examples:
      healthd install --print-unit --config /etc/clusterctl/healthd.toml
      healthd install --prefix / && systemctl daemon-reload
    """
    from clusterctl.healthd.unit_file import (
        InstallError, install_files, packaged_guide, packaged_text, render_unit, write_install,
    )

    if sum((print_unit, print_config, prefix is not None)) != 1:
        raise click.UsageError("give one of --print-unit, --print-config, --prefix DIR")
    if force and prefix is None:
        raise click.UsageError("--force only goes with --prefix")
    example = packaged_text("healthd.example.toml")
    if print_config:
        click.echo(example, nl=False)
        return
    executable = healthd_path or _installed_healthd()
    if executable is None:
        click.echo("healthd: error: cannot tell where healthd is installed (not on PATH): give --healthd PATH", err=True)
        sys.exit(2)
    config = _config(config_path)
    unit = render_unit(packaged_text("systemd/healthd.service"), healthd=str(executable.absolute()),
                       config_path=str((config_path or DEFAULT_CONFIG).absolute()), config=config,
                       guide=packaged_guide())
    if prefix is None:
        click.echo(unit, nl=False)
        return
    try:
        written = write_install(prefix, install_files(unit, example), force=force)
    except InstallError as exc:
        click.echo(f"healthd: error: {one_line(str(exc))}", err=True)
        sys.exit(exc.exit_code)
    for path in written:
        click.echo(f"wrote {path}")
    click.echo("next: edit the config, `healthd run --dry-run` once by hand, then "
               "`systemctl daemon-reload && systemctl enable --now healthd` (docs/install.md#admins)")


@cli.command()
@click.argument("node")
@click.option("--with", "neighbour", default="", metavar="GOOD",
              help="The known-good neighbour (default: the first idle node of the partition).")
@click.option("--partition", default="", help="Run the test job in this partition (default: [prove] partition).")
@click.option("--reservation", default="", help="... or in this reservation (default: [prove] reservation).")
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--history", "history_path", type=click.Path(path_type=Path, dir_okay=False),
              help="The proof journal (default: <journal_dir>/proofs.jsonl): its passing lines are the fleet's median.")
@click.option("--no-record", is_flag=True, help="Judge, but do not append the result to the journal.")
@click.option("--dry-run", is_flag=True, help="Print the srun argv and run nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the healthd-proof record as one line of JSON.")
def prove(node: str, neighbour: str, partition: str, reservation: str, config_path: Path | None,
          history_path: Path | None, no_record: bool, dry_run: bool, as_json: bool) -> None:
    """Prove NODE with a known-good neighbour: a bandwidth/latency test between the two, as one Slurm job.

    \b
    The test is [prove] argv in healthd.toml (e.g. nccl-tests' all_reduce_perf, parser "nccl-tests"), else
    the built-in TCP link test (no GPU needed).  It passes at >= bandwidth_share of the fleet's median
    bandwidth and <= latency_factor of its median latency (the journal's passing proofs of the same test);
    absolute floors until min_history proofs passed.  A drained node takes no job: run it in a
    reservation holding both nodes (docs/admins-guide.md, "Proving a node with a neighbour").
    Exit 0 proven; 1 measured and below the thresholds; 6 not proven (the job did not start, the test
    gave no measurement); 2 bad input; 10 an unreadable journal; 78 a bad config.
    """
    from clusterctl.healthd.prove import ProofRequest, choose_neighbour, describe, proof_argv, run_proof
    from clusterctl.records.healthd_proof import append_proof, proofs_path, read_proofs
    from clusterctl.slurm.commands import Slurm
    from clusterctl.slurm.names import node_name_problem

    config = _config(config_path)
    settings = config.prove
    partition = partition or (settings.partition if not reservation else "")
    reservation = reservation or (settings.reservation if not partition else "")
    for what, name in (("NODE", node), ("--with", neighbour), ("--partition", partition),
                       ("--reservation", reservation)):
        problem = node_name_problem(name) if name else None
        if problem:
            click.echo(f"healthd: error: {what}: {one_line(problem)}", err=True)
            sys.exit(2)
    if neighbour == node:
        click.echo("healthd: error: --with must name another node than NODE", err=True)
        sys.exit(2)
    slurm = Slurm()
    try:
        history = read_proofs(history_path or proofs_path(config.journal_dir))
        if not neighbour:
            neighbour = choose_neighbour(node, slurm.idle_nodes(partition or None)) or ""
    except ClusterctlError as exc:
        click.echo(f"healthd: error: {one_line(str(exc))}", err=True)
        sys.exit(getattr(exc, "exit_code", EXIT_NOT_PROVEN))
    if not neighbour:
        click.echo(f"healthd: error: no idle node{f' in {partition}' if partition else ''} to be the neighbour: "
                   "give --with GOOD", err=True)
        sys.exit(EXIT_NOT_PROVEN)
    request = ProofRequest(node, neighbour, partition, reservation)
    if dry_run:
        click.echo(json.dumps(proof_argv(request, settings)) if as_json else
                   " ".join(proof_argv(request, settings)))
        return
    result = run_proof(request, settings, slurm.runner, history, time.time)
    if not no_record:
        try:
            append_proof(history_path or proofs_path(config.journal_dir), result)
        except OSError as exc:
            click.echo(f"healthd: warning: the result is not journaled: {one_line(str(exc))}", err=True)
    if as_json:
        click.echo(json.dumps(result.to_json(), sort_keys=True))
    else:
        for line in describe(result):
            click.echo(one_line(line))
    sys.exit({"pass": 0, "fail": EXIT_PROOF_FAILED}.get(result.outcome, EXIT_NOT_PROVEN))


@cli.command("link-test", hidden=True)
@click.option("--bytes", "size", type=click.IntRange(1, 16 << 30), default=256 << 20)
@click.option("--pings", type=click.IntRange(1, 100_000), default=1000)
@click.option("--port", type=click.IntRange(0, 65535), default=0)
@click.option("--timeout", type=click.FloatRange(1.0, 4 * 3600.0), default=600.0)
def link_test(size: int, pings: int, port: int, timeout: float) -> None:
    """One task of `healthd prove`'s built-in TCP test (run by srun on both nodes; task 0 prints the result)."""
    from clusterctl.healthd.proof_link import LinkTestError, run_link_test

    try:
        result = run_link_test(os.environ, port=port, size=size, pings=pings, timeout=timeout)
    except LinkTestError as exc:
        click.echo(f"healthd link-test: error: {one_line(str(exc))}", err=True)
        sys.exit(1)
    if result is not None:
        click.echo(result.line())


def _installed_healthd() -> Path | None:
    """The healthd executable running now, else the one on PATH."""
    import shutil

    running = Path(sys.argv[0])
    if running.name == "healthd" and running.is_file():
        return running
    found = shutil.which("healthd")
    return Path(found) if found else None


def main() -> None:
    cli()
