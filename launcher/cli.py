"""`clusterctl`: the command ML engineers run on a login node."""

from __future__ import annotations

import sys

import click

from launcher import __version__

EXIT_NOT_AVAILABLE = 69  # EX_UNAVAILABLE: the feature is not built yet


def _not_yet(feature: str) -> None:
    click.echo(f"clusterctl: `{feature}` is not available in clusterctl {__version__} yet.", err=True)
    sys.exit(EXIT_NOT_AVAILABLE)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="clusterctl")
def cli() -> None:
    """Keep large GPU training jobs running on Slurm.

    \b
    Planned subcommands (this release ships the foundation: testbed, emulated GPUs,
    example trainer); each says so plainly until it lands:
      submit     topology-aware sbatch script + rank map, then sbatch
      plan       show the rank map and its cost for a layout and a node list
      hostlist   expand / compress Slurm hostlists
      status     state, nodes and logs of a run
      supervise  resubmit a run from its last complete checkpoint after node failures
    """


@cli.command(context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def submit(args: tuple[str, ...]) -> None:
    """Submit a job spec (not available yet)."""
    _not_yet("submit")


@cli.command(context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def plan(args: tuple[str, ...]) -> None:
    """Plan a topology-aware rank map (not available yet)."""
    _not_yet("plan")


@cli.command(context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def hostlist(args: tuple[str, ...]) -> None:
    """Expand or compress Slurm hostlists (not available yet)."""
    _not_yet("hostlist")


@cli.command(context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def status(args: tuple[str, ...]) -> None:
    """Show a run's state (not available yet)."""
    _not_yet("status")


@cli.command(context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def supervise(args: tuple[str, ...]) -> None:
    """Supervise a run across node failures (not available yet)."""
    _not_yet("supervise")


def main() -> None:
    cli()
