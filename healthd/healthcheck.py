"""Slurm's HealthCheckProgram for clusterctl nodes (`clusterctl-healthcheck`, or `healthd check`).

Answers from clusterctl.healthd's cached state in milliseconds when the daemon is alive (no NVML
call), falls back to a quick direct check when it is not (and says so), drains the node
with a healthd-owned reason on a blocking verdict, and exits within Slurm's 60 s limit.
What it shares with the prolog and the epilog (config, budget, drain door): healthd/hook_common.py.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from clusterctl.healthd.config import HealthdConfig
from clusterctl.healthd.diagnostic_runner import diagnostics_in_force
from clusterctl.healthd.gate import PCI_DEVICES, check_node, from_state, gpus_expected, read_state, state_is_fresh
from clusterctl.healthd.hook_common import (
    bounded, budgeted_slurm, drain_node, hook_config, node_name, problem_reason, say,
)
from clusterctl.slurm.commands import Runner, subprocess_runner
from clusterctl.slurm.nodes import NodeSlurm

EXIT_GPUS_NOT_CHECKED = 5
"""`healthd check`: this node should have GPUs (healthd.toml `gpus_expected`) and NVML cannot judge them."""

HEALTHCHECK_LIMIT = 50.0
"""Seconds HealthCheckProgram may take at most, whatever `hook_timeout` says: slurmd kills it at 60 s."""


def run_health_check(environ: dict[str, str], slurm_factory: Callable[[str], NodeSlurm] | None = None,
                     config: HealthdConfig | None = None, *, config_path: Path | None = None,
                     runner: Runner = subprocess_runner, clock: Callable[[], float] = time.monotonic,
                     pci_devices: Path = PCI_DEVICES) -> int:
    """Slurm's HealthCheckProgram: healthd's cached verdicts (milliseconds), else a quick direct check.
    Its drain path's Slurm calls share its budget as the prolog's and the epilog's do.

    0: healthy, or a problem handed to the drain door (which says what it did); EXIT_GPUS_NOT_CHECKED when
    nothing blocks but the GPUs this node should have (`gpus_expected`; "auto" reads `pci_devices`) could not
    be judged (no NVML).  Slurm only logs a non-zero exit of a HealthCheckProgram: it drains nothing."""
    start = clock()
    config = hook_config("healthcheck", config, config_path)
    seconds = min(config.hook_timeout, HEALTHCHECK_LIMIT)
    if slurm_factory is None:
        slurm_factory = budgeted_slurm(runner, start, seconds, clock)
    with bounded("healthcheck", seconds, lambda: 0):
        return _health_check(environ, slurm_factory, config, pci_devices)


def _health_check(environ: dict[str, str], slurm_factory: Callable[[str], NodeSlurm], config: HealthdConfig,
                  pci_devices: Path) -> int:
    node = node_name(environ, config)
    state, unusable = read_state(config)
    if unusable:
        say("healthcheck", unusable)
    if state is not None and state_is_fresh(state, config, time.time()):
        problems = from_state(state, None)
        source = "healthd state"
        unchecked = None if state.nvml_ok else "healthd cannot use NVML (see `healthd status`)"
    else:
        say("healthcheck", "healthd is not running or its state is stale: checking NVML directly")
        report = check_node(config, None)
        for note in report.notes:
            say("healthcheck", note)
        problems = report.problems
        source = "direct check"
        unchecked = report.gpus_unchecked
    if not problems:
        return _said_healthy(node, source, unchecked, config, pci_devices)
    for problem in problems:
        say("healthcheck", f"{node}: {problem.describe()} ({source})")
    # At slurmd start the node may not be registered yet: the Slurm command then fails or times out
    # (bounded), and the next run drains.
    say("healthcheck", drain_node(config, node, problem_reason(problems[0]), slurm_factory).text)
    return 0


def _said_healthy(node: str, source: str, unchecked: str | None, config: HealthdConfig, pci_devices: Path) -> int:
    """The line of a node with no blocking problem, and its exit: a node whose GPUs could not be judged is
    not called healthy when it should have GPUs."""
    for line in diagnostics_in_force(config).describe():
        say("healthcheck", f"{node} {line}")
    if unchecked is None:
        print(f"clusterctl-healthcheck: {node} healthy ({source})")
        return 0
    expected, why = gpus_expected(config, pci_devices)
    if not expected:
        print(f"clusterctl-healthcheck: {node} healthy ({source}; GPUs not checked: {unchecked}; none expected "
              f"here: {why})")
        return 0
    print(f"clusterctl-healthcheck: {node} GPUs NOT CHECKED ({source}): {unchecked}; expected here: {why} "
          f"(exit {EXIT_GPUS_NOT_CHECKED})")
    return EXIT_GPUS_NOT_CHECKED


def main() -> None:
    sys.exit(run_health_check(dict(os.environ)))
