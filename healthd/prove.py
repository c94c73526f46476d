"""`healthd prove NODE`: a node proven with a known-good neighbour before it returns to service.

One Slurm job of two nodes (the node and the neighbour, one `srun` in the partition or reservation the
admin names) runs a bandwidth/latency test between them: the site's own command ([prove] argv in
healthd.toml, e.g. nccl-tests' `all_reduce_perf` over NCCL, read by `parser = "nccl-tests"`), else the
built-in TCP link test (healthd/proof_link.py: no GPU needed).  The measurement is judged against the
fleet's healthy median (healthd/proof_verdict.py) and the result appended to the proof journal, whose
passing lines are that median's history.

The srun argv is built here as data (`proof_argv`, shown by `--dry-run`) and run through the Slurm door's
`Runner` (argv list, timeout): tests pass a fake that replays srun's output.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from clusterctl.errors import SlurmCommandError
from clusterctl.records.healthd_proof import ProofResult
from clusterctl.healthd.diagnostics import excerpt
from clusterctl.healthd.proof_verdict import (
    LINK_TEST, Measurement, ProofLimits, UnreadableOutput, judge, read_link_test, read_nccl_tests,
)
from clusterctl.slurm.commands import Runner
from clusterctl.text import one_line

ProofParser = Literal["nccl-tests", "link-test"]
PROOF_PARSERS: tuple[ProofParser, ...] = ("nccl-tests", "link-test")
SRUN_GRACE_S = 30.0
"""srun's own time to allocate, launch and tear down, beyond the test's timeout and the start wait."""


@dataclass(frozen=True)
class ProveSettings:
    """[prove] in healthd.toml: how a node is proven."""

    argv: tuple[str, ...] = ()
    """The site's test, run as one task per node (or `tasks_per_node`) on both nodes; () for the built-in TCP test."""
    parser: ProofParser = "nccl-tests"
    """How `argv`'s output is read: nccl-tests' table, or the link test's JSON line."""
    srun_options: tuple[str, ...] = ()
    """Extra srun options for the site's test (`--gpus-per-node=8`, `--mpi=pmix`)."""
    tasks_per_node: int = 1
    partition: str = ""
    reservation: str = ""
    timeout: float = 600.0
    """The test's own time at most (seconds, from its start)."""
    start_within: float = 120.0
    """The job must start within this (srun --immediate): a drained node takes no job and would wait for ever."""
    python: str = ""
    """The Python on the compute nodes that runs the built-in test ("" this one, sys.executable)."""
    link_bytes: int = 256 << 20
    link_pings: int = 1000
    port: int = 0
    """The built-in test's port (0: 29400 + the job id modulo 1000)."""
    limits: ProofLimits = field(default_factory=ProofLimits)

    @property
    def test(self) -> str:
        """The test's name in the journal: history is compared only within one test."""
        return one_line(" ".join(self.argv))[:120] if self.argv else LINK_TEST


@dataclass(frozen=True)
class ProofRequest:
    node: str
    neighbour: str
    partition: str = ""
    reservation: str = ""


def test_command(settings: ProveSettings) -> list[str]:
    """What each task runs: the site's test, or the built-in one."""
    if settings.argv:
        return list(settings.argv)
    python = settings.python or sys.executable
    return [python, "-m", "clusterctl.healthd", "link-test", f"--bytes={settings.link_bytes}",
            f"--pings={settings.link_pings}", f"--port={settings.port}", f"--timeout={settings.timeout:g}"]


def proof_argv(request: ProofRequest, settings: ProveSettings) -> list[str]:
    """The one srun of the proof (pure)."""
    minutes = max(1, math.ceil((settings.timeout + SRUN_GRACE_S) / 60))
    tasks = settings.tasks_per_node if settings.argv else 1
    where = ([f"--reservation={request.reservation}"] if request.reservation else []) + (
        [f"--partition={request.partition}"] if request.partition else [])
    return ["srun", "--job-name=healthd-prove", "--nodes=2", f"--ntasks={2 * tasks}", f"--ntasks-per-node={tasks}",
            f"--nodelist={request.node},{request.neighbour}", f"--immediate={math.ceil(settings.start_within)}",
            f"--time={minutes}", *where, *(settings.srun_options if settings.argv else ()), *test_command(settings)]


def read_measurement(settings: ProveSettings, text: str) -> Measurement:
    """The test's output read by its parser; UnreadableOutput when it holds no measurement."""
    if settings.argv and settings.parser == "nccl-tests":
        return read_nccl_tests(text)
    return read_link_test(text)


_NOT_STARTED = ("Unable to allocate resources", "Requested node configuration is not available",
                "Immediate execution impossible", "Invalid partition", "Invalid reservation",
                "Access denied")


def run_proof(request: ProofRequest, settings: ProveSettings, runner: Runner, history: Sequence[ProofResult],
              clock: Callable[[], float]) -> ProofResult:
    """Run the proof's srun and judge it; never raises for Slurm's or the test's sake (an "error" result)."""
    argv = proof_argv(request, settings)
    began = clock()

    def result(outcome: Literal["pass", "fail", "error"], reasons: Sequence[str], evidence: str = "",
               measured: Measurement | None = None, limits: tuple[float | None, float | None, str] = (None, None, "")
               ) -> ProofResult:
        now = clock()
        return ProofResult(request.node, request.neighbour, settings.test, outcome, now, round(now - began, 3),
                           measured.bandwidth_gbs if measured else None, measured.latency_us if measured else None,
                           limits[0], limits[1], limits[2], tuple(one_line(r)[:300] for r in reasons),
                           excerpt(evidence))

    try:
        done = runner(argv, settings.start_within + settings.timeout + SRUN_GRACE_S)
    except SlurmCommandError as exc:
        return result("error", [f"srun: {exc}"])
    evidence = f"{done.stdout}\n{done.stderr}".strip()
    try:
        measured = read_measurement(settings, done.stdout)
    except UnreadableOutput as exc:
        if done.returncode != 0 and any(s in done.stderr for s in _NOT_STARTED):
            return result("error", [f"the job did not start on {request.node} and {request.neighbour} "
                                    f"(exit {done.returncode}): a drained node takes no job: give a reservation "
                                    f"holding both and resume the node into it"], evidence)
        return result("error", [f"exit {done.returncode}: {exc}"], evidence)
    if done.returncode != 0:
        measured = Measurement(measured.bandwidth_gbs, measured.latency_us,
                               (*measured.problems, f"the test exited {done.returncode}"))
    verdict = judge(measured, history, settings.test, settings.limits)
    limit = verdict.thresholds
    return result("pass" if verdict.passed else "fail", verdict.reasons, evidence, measured,
                  (limit.min_bandwidth_gbs, limit.max_latency_us, limit.basis))


def choose_neighbour(node: str, idle: Sequence[str]) -> str | None:
    """A known-good neighbour: the first idle node that is not `node` (an idle node is in service and free)."""
    return next((n for n in idle if n != node), None)


def describe(result: ProofResult) -> list[str]:
    """The result in words, for the terminal."""
    said = {"pass": "proven", "fail": "FAILED", "error": "NOT PROVEN (the test did not give a measurement)"}
    lines = [f"{result.node} with {result.neighbour} ({result.test}): {said[result.outcome]}"]
    if result.bandwidth_gbs is not None or result.latency_us is not None:
        lines.append(f"  measured: bandwidth {_shown(result.bandwidth_gbs, 'GB/s')}, latency {_shown(result.latency_us, 'us')}")
    if result.min_bandwidth_gbs is not None:
        lines.append(f"  needed: bandwidth >= {result.min_bandwidth_gbs:.3g} GB/s, latency <= "
                     f"{_shown(result.max_latency_us, 'us')} ({result.basis})")
    lines += [f"  why: {reason}" for reason in result.reasons]
    if result.outcome != "pass" and result.excerpt:
        lines.append(f"  output: {result.excerpt}")
    return lines


def _shown(value: float | None, unit: str) -> str:
    return "not reported" if value is None else f"{value:.3g} {unit}"
