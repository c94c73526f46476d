"""`healthd`: the GPU node health daemon (admins run it as a systemd service)."""

from __future__ import annotations

import sys

import click

EXIT_NOT_AVAILABLE = 69  # EX_UNAVAILABLE: the feature is not built yet


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Watch this node's GPUs through NVML and drain the node in Slurm when one breaks.

    \b
    Planned subcommands; each says so plainly until it lands:
      run      the daemon (NVML events, kernel log, periodic checks)
      status   the current verdict per GPU
      check    a fast check for Slurm's HealthCheckProgram
      policy   the fault policy table
    """


def _not_yet(feature: str) -> None:
    click.echo(f"healthd: `{feature}` is not available yet.", err=True)
    sys.exit(EXIT_NOT_AVAILABLE)


@cli.command()
def run() -> None:
    """Run the daemon in the foreground (not available yet)."""
    _not_yet("run")


@cli.command()
def status() -> None:
    """Show the current verdict per GPU (not available yet)."""
    _not_yet("status")


@cli.command()
def policy() -> None:
    """Print the fault policy table (not available yet)."""
    _not_yet("policy")


def main() -> None:
    cli()
