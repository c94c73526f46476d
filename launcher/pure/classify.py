"""Why did an attempt end, and which nodes (if any) are to blame?  (pure)

Evidence, strongest first: a node drained by healthd (reason `healthd: ...`), the epilog's
per-job health record saying `hardware_fault`, a node Slurm marks DOWN or not responding
(what NODE_FAIL means), any other drain of a node of the failed job.  With no node to
blame a failure is the program's own.  Words in the job's log that mean a full disk or quota
stop the run: resubmitting cannot help.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from clusterctl.records.drain_reason import STRAGGLER
from clusterctl.records.job_health import JobHealthRecord
from clusterctl.records.run_journal import BlamedNode, OutcomeKind
from clusterctl.slurm.jobs import JobReport
from clusterctl.slurm.nodes import NodeState

COMPLETED, USER_CANCELLED, RESUBMIT, NODE_FAILURE, PROGRAM_FAILURE, STORAGE, MISPLACED = (
    OutcomeKind.COMPLETED, OutcomeKind.USER_CANCELLED, OutcomeKind.RESUBMIT, OutcomeKind.NODE_FAILURE,
    OutcomeKind.PROGRAM_FAILURE, OutcomeKind.STORAGE_FULL, OutcomeKind.MISPLACED)
STORAGE_WORDS = re.compile(r"No space left on device|Disk quota exceeded|ENOSPC|EDQUOT|quota exceeded", re.I)
PREFLIGHT_WORDS = "clusterctl: preflight failed:"
SRUN_EXITED = re.compile(r"^srun: error: (?P<node>[A-Za-z0-9._-]+): tasks? [0-9,\-]+: Exited with exit code (?P<code>\d+)\s*$",
                         re.M)
"""srun's line for tasks that exited by themselves (killed ones say `Terminated` or `Killed`)."""


def exited_codes(log_text: str) -> dict[int, list[str]]:
    """Exit codes the program's own ranks exited with, as srun logged them, and on which nodes (in order)."""
    found: dict[int, list[str]] = {}
    for match in SRUN_EXITED.finditer(log_text):
        nodes = found.setdefault(int(match.group("code")), [])
        if match.group("node") not in nodes:
            nodes.append(match.group("node"))
    return found


@dataclass(frozen=True)
class ExitRequest:
    """What the program asked for with its exit code (restart.exit_actions), and where it exited so."""

    action: str  # "restart", "exclude-node" or "stop"
    code: int
    nodes: tuple[str, ...]


def exit_request(log_text: str, actions: Sequence[tuple[int, str]]) -> ExitRequest | None:
    """The first request among the exit codes srun logged (`stop` wins over the others: never restart a
    program that asked not to be)."""
    wanted = dict(actions)
    requests = [ExitRequest(wanted[code], code, tuple(nodes)) for code, nodes in exited_codes(log_text).items()
                if code in wanted]
    requests.sort(key=lambda r: (r.action != "stop", r.code))
    return requests[0] if requests else None


@dataclass(frozen=True)
class Blame:
    """A node held responsible, with the evidence that says so."""

    node: str
    reason: str
    evidence: tuple[str, ...]

    def to_journal(self, until: float | None = None) -> BlamedNode:
        """As the run journal keeps it (`until`: when the blame expires)."""
        return BlamedNode(self.node, self.reason, self.evidence, until)

    @classmethod
    def from_journal(cls, blamed: BlamedNode) -> Blame:
        """A blame read back from the run journal."""
        return cls(blamed.node, blamed.reason, blamed.evidence)


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended, in the supervisor's terms."""

    kind: OutcomeKind
    message: str
    blame: tuple[Blame, ...] = ()


def node_down(state: NodeState) -> bool:
    """Slurm declared the node DOWN (it missed pings for SlurmdTimeout, or an admin said so)."""
    return state.state.startswith("down")


def not_responding(state: NodeState) -> bool:
    """A missed ping: on a busy controller healthy nodes show this for a moment too."""
    return "NOT_RESPONDING" in state.flags or state.state.endswith("*")


def _too_many_to_believe(nodes: Sequence[str], job_nodes: Sequence[str]) -> bool:
    # Most of a job's nodes going quiet at once is the controller's (or the network's) trouble,
    # not a hardware fault on each of them: blaming them would exclude healthy nodes.
    return len(nodes) >= 2 and len(nodes) * 2 > len(job_nodes)


def hardware_suspects(job_nodes: Sequence[str], nodes: Mapping[str, NodeState],
                      unresponsive_for: Mapping[str, float] | None = None, grace: float = 30.0) -> list[Blame]:
    """Nodes of a running job to end the attempt for: drained by healthd, DOWN, or silent for
    `grace` seconds (`unresponsive_for`: how long each node has been seen not responding).

    An admin's drain is not here: Slurm lets running jobs finish on a drained node, and so do we.
    """
    unresponsive_for = unresponsive_for or {}
    found, silent = [], []
    for name in job_nodes:
        state = nodes.get(name)
        if state is None:
            continue
        if _failure_drain(state):  # healthd's (or the prolog's, same rules) `healthd: ...` reason
            found.append(Blame(name, state.reason, (f"drained by healthd: {state.reason}",)))
        elif node_down(state):
            found.append(Blame(name, f"node {state.state} ({state.reason or 'no reason'})",
                               (f"Slurm: {name} is {state.state} {list(state.flags)} reason {state.reason!r}",)))
        elif not_responding(state) and unresponsive_for.get(name, 0.0) >= grace:
            silent.append(Blame(name, f"{NOT_RESPONDING_REASON} {unresponsive_for[name]:.0f} s",
                                (f"Slurm: {name} is {state.state} {list(state.flags)} for "
                                 f"{unresponsive_for[name]:.0f} s",)))
    if silent and not _too_many_to_believe([b.node for b in silent], job_nodes):
        found += silent
    return found


NOT_RESPONDING_REASON = "not responding for"
"""How the `reason` of a Blame for a node Slurm says is not responding begins (then: for how long)."""
OPERATOR_DRAIN_REASON = "drained by an operator"
"""The `reason` of a Blame for a node an admin (or another tool) drained while the job ran on it."""


def operator_drains(job_nodes: Sequence[str], nodes: Mapping[str, NodeState]) -> list[Blame]:
    """Nodes of a running job that an operator drained (a reason that is neither healthd's nor a
    straggler verdict's): the operator wants the node back.  Slurm lets the job finish there; a job
    with a spare swaps the node out at once instead (the caller decides whether it has one)."""
    found = []
    for name in job_nodes:
        state = nodes.get(name)
        if state is None or not state.draining or state.drain_owner is not None:
            continue
        found.append(Blame(name, OPERATOR_DRAIN_REASON,
                           (f"Slurm: {name} is {state.state} {list(state.flags)} reason {state.reason!r} "
                            "(an operator's drain: neither healthd's nor a straggler verdict's)",)))
    return found


def _straggler_drain(state: NodeState) -> bool:
    return state.drain_owner is STRAGGLER  # `clusterctl straggler: ...` (or the old `healthd: straggler ...`)


def _failure_drain(state: NodeState) -> bool:
    """Drained by healthd's rules for a fault.  A straggler drain (`clusterctl straggler: ...`) is not one: the node is
    slow, not failed, and the straggler watch that drained it already chose what the job does
    (reported, or excluded from the next submission), so it neither ends a running attempt nor
    takes the blame for a job that later fails by itself."""
    return state.drained_by_us and not _straggler_drain(state)


def classify(report: JobReport, job_nodes: Sequence[str], nodes: Mapping[str, NodeState],
             epilog_records: Mapping[str, JobHealthRecord], log_tail: str, ended_by_us: Sequence[Blame] = (),
             exit_actions: Sequence[tuple[int, str]] = ()) -> Outcome:
    """The outcome of a finished attempt from Slurm's report and the evidence around it."""
    state = report.state
    if state == "COMPLETED":
        return Outcome(COMPLETED, "the job completed")
    if ended_by_us:
        ended: list[Blame] = []
        for b in ended_by_us:
            record = epilog_records.get(b.node)
            extra = (record.summary(),) if record is not None and record.hardware_fault else ()
            ended.append(Blame(b.node, b.reason, (f"job {report.job_id} ended by the supervisor ({state})",
                                                  *b.evidence, *extra)))
        return Outcome(NODE_FAILURE, f"a node failed under job {report.job_id}; ended it at once; blamed "
                                     f"{', '.join(b.node for b in ended)}", tuple(ended))
    # CANCELLED with a node drained by healthd's rules: the prolog refused that node, and with
    # --no-requeue Slurm cancels the job instead of requeueing it.  That is a node failure.
    refused = any(_failure_drain(nodes[n]) for n in job_nodes if n in nodes)
    if state == "CANCELLED" and not refused:
        return Outcome(USER_CANCELLED, "cancelled by someone else (scancel); not resubmitting")
    if state in ("TIMEOUT", "PREEMPTED", "DEADLINE"):
        return Outcome(RESUBMIT, f"{state.lower()}: resubmitting from the last checkpoint")
    if STORAGE_WORDS.search(log_tail):
        line = next((ln for ln in log_tail.splitlines() if STORAGE_WORDS.search(ln)), "")
        return Outcome(STORAGE, f"storage is full or over quota: {line.strip()[:200]}")
    if PREFLIGHT_WORDS in log_tail:
        line = next(ln for ln in log_tail.splitlines() if PREFLIGHT_WORDS in ln)
        return Outcome(MISPLACED, f"ranks did not start where the rank map says: {line.strip()[:200]}")

    evidence: dict[str, list[str]] = {}
    reasons: dict[str, str] = {}
    for name in job_nodes:
        node_state = nodes.get(name)
        record = epilog_records.get(name)
        if node_state is not None and _failure_drain(node_state):
            evidence.setdefault(name, []).append(f"drained by healthd: {node_state.reason}")
            reasons.setdefault(name, node_state.reason)
        if record is not None and record.hardware_fault:
            evidence.setdefault(name, []).append(record.summary())
            reasons.setdefault(name, f"epilog: {record.verdict.label}")
        if node_state is not None and node_down(node_state):
            evidence.setdefault(name, []).append(f"Slurm: {name} is {node_state.state} {list(node_state.flags)}"
                                                 f" reason {node_state.reason!r}")
            reasons.setdefault(name, f"node {node_state.state}")
    silent = [n for n in job_nodes if n in nodes and not_responding(nodes[n]) and n not in evidence]
    if state == "NODE_FAIL" and not any(node_down(nodes[n]) for n in job_nodes if n in nodes) and silent \
            and not _too_many_to_believe(silent, job_nodes):
        # Slurm failed the job for a node it has not marked DOWN yet: the silent one.
        for name in silent:
            # An admin's or a health checker's reason on it is evidence too (why it was drained first).
            said = f" (reason {nodes[name].reason!r})" if nodes[name].reason else ""
            evidence.setdefault(name, []).append(f"Slurm: job NODE_FAIL and {name} is not responding{said}")
            reasons.setdefault(name, "not responding (NODE_FAIL)")
    if not evidence:
        for name in job_nodes:  # weakest: somebody drained it while the job ran
            node_state = nodes.get(name)
            if node_state is not None and node_state.draining and not _straggler_drain(node_state):
                evidence[name] = [f"drained during the job: {node_state.reason!r}"]
                reasons[name] = f"drained: {node_state.reason}"
    exit_note = f" (exit {report.exit_code})" if report.exit_code is not None else ""
    if evidence:
        blame = tuple(Blame(n, reasons[n], (f"job {report.job_id} ended {state}{exit_note}", *evidence[n]))
                      for n in job_nodes if n in evidence)
        return Outcome(NODE_FAILURE, f"{state}{exit_note}; blamed {', '.join(b.node for b in blame)}", blame)
    if state in ("NODE_FAIL", "BOOT_FAIL"):
        return Outcome(NODE_FAILURE, f"{state} but no node of the job is down now; resubmitting without exclusions")
    request = exit_request(log_tail, exit_actions)
    if request is not None:
        return asked_outcome(request, "resubmitting from the last checkpoint")
    return Outcome(PROGRAM_FAILURE, f"{state}{exit_note} with every node of the job healthy: the program's own "
                                    "failure")


def asked_outcome(request: ExitRequest, restarting: str) -> Outcome:
    """What a program's exit code asked for (restart.exit_actions), as an outcome: stop, a node failure of
    the nodes whose ranks exited so, or a restart (`restarting` says how) that is no failure of the program."""
    asked = f"the program asked to {request.action} (exit {request.code} on {', '.join(request.nodes)}; " \
            "restart.exit_actions)"
    if request.action == "stop":
        return Outcome(OutcomeKind.PROGRAM_ASKED_STOP, f"{asked}: stopping")
    if request.action == "exclude-node":
        blame = tuple(Blame(n, f"the program asked to exclude it (exit {request.code})",
                            (f"srun: {n}: ranks exited with code {request.code}",)) for n in request.nodes)
        return Outcome(NODE_FAILURE, f"{asked}; blamed {', '.join(request.nodes)}", blame)
    return Outcome(RESUBMIT, f"{asked}: {restarting}")


def step_outcome(exit_code: int, suspects: Sequence[Blame], hang_evidence: Sequence[str] | None = None,
                 log_tail: str = "", exit_actions: Sequence[tuple[int, str]] = (),
                 resume_failures: Sequence[str] = ()) -> Outcome:
    """How a step of the in-allocation agent ended: `exit_code` (srun's), the nodes that failed under it
    (`suspects`: hardware, or ranks that stopped progressing first), `hang_evidence` when the step was
    ended because its ranks stopped progressing (None: it was not), the step's log (its exit codes), and
    what the step's nodes wrote when they could not load their part of the resume checkpoint
    (`resume_failures`, multi-level checkpoints: each such rank exits EXIT_RESUME_FAILED, 87).

    A failed resume with no node to blame is not the program's failure: the step starts again (one
    restart of the budget) from the next plan, which passes over the copies that failed.  It is told by
    the nodes' failure records, not by srun's exit code: srun ends the other ranks of the step
    (--kill-on-bad-exit) and returns the highest code, 128 + SIGKILL, as often as 87."""
    if suspects:
        return Outcome(NODE_FAILURE, "; ".join(f"{b.node}: {b.reason}" for b in suspects), tuple(suspects))
    if hang_evidence is not None:  # every rank stopped at once: no node to blame, start again
        return Outcome(RESUBMIT, " ".join(hang_evidence) or "every rank stopped progressing at once")
    if exit_code == 0:
        return Outcome(COMPLETED, "the step completed")
    if resume_failures:
        return Outcome(RESUBMIT, f"resuming failed (the step exited {exit_code}): " + "; ".join(resume_failures)
                       + "; starting again from the next copy or checkpoint")
    request = exit_request(log_tail, exit_actions)
    if request is not None:
        return asked_outcome(request, "starting the step again")
    return Outcome(PROGRAM_FAILURE, f"the step exited {exit_code} with every node healthy")


def node_read_interval(nodes: int) -> float:
    """How often the in-allocation agent reads the step's nodes from Slurm while it runs: each read is one
    single-node query per node (0.1-0.5 ms of controller time each), so larger steps read less
    often; a step whose ranks crash is seen at once anyway (srun exits)."""
    return max(2.0, 0.25 * nodes)
