"""healthd's judgement (pure): findings + what healthd remembers + the node as Slurm sees it + time
→ what healthd now remembers + the actions to take.

Everything healthd decides lives here, as functions over frozen dataclasses: the policy
verdict per finding, storm de-duplication, drain once (never over another drain, never
while one is in flight), findings that hold until a periodic check no longer sees them,
resume once checks are clean again (only our own drains, only with evidence), the drain
breaker, and repeated application Xids across jobs.  The daemon (daemon.py) only moves
data in and out: it feeds `step` and `applied`, journals and applies the planned actions,
and writes `state_view` to the state file.  The prolog, epilog and HealthCheckProgram use
the same policy through `gate_verdict` and `blocks_new_work`.  How healthd's actions meet the drain
door (its rules, its requests) is healthd/drain_requests.py's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from clusterctl.clock import parse_utc, utc
from clusterctl.healthd.config import HealthdConfig
from clusterctl.healthd.diagnostics import Diagnostics, DiagnosticSpec, Level
from clusterctl.healthd.findings import Action, Finding, Verdict
from clusterctl.healthd.policy import POLICY_VERSION, PolicyConfig, drain_reason, judge
from clusterctl.healthd.return_to_service import DIAGNOSTIC_RETRY_S, ReturnFacts, return_decision
from clusterctl.records.drain_reason import HEALTHD, parse_drain_reason
from clusterctl.records.healthd_actions import PlannedAction
from clusterctl.records.healthd_diagnostic import DiagnosticResult
from clusterctl.records.healthd_job_start import JobStart
from clusterctl.records.healthd_state import Alert, GpuState, HealthdState, StateFinding
from clusterctl.records.healthd_xid_history import XidSighting
from clusterctl.slurm import drains
from clusterctl.slurm.nodes import NodeState

RECENT_EVENTS = 50
"""One-off findings kept for the state file (older ones fall off)."""
RECENT_ALERTS = 20
MAX_HISTORY = 1000
"""Xids remembered for the repeat rule, newest kept: a storm of lines must not grow memory without bound."""
ALERT_WINDOW_S = 24 * 3600.0
"""Alerts older than this leave the state file."""
MAX_DEDUP_KEYS = 1000
"""De-duplication keys remembered (each expires after the de-dup window; the newest are kept)."""
NODE_KEY = "node"
"""Key of node-level findings (no GPU) in `EngineState.current`."""


@dataclass(frozen=True)
class EngineSettings:
    """The part of healthd.toml the engine decides with."""

    node: str
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    dedup_window: float = 300.0
    """The same Xid (or event) on the same GPU within this many seconds is one fault (a storm)."""
    resume_when_clean: bool = False
    clean_checks: int = 3
    breaker_max_share: float = 0.1
    partition: str = ""
    dry_run: bool = False
    breaker_retry: float = 600.0
    """After the breaker refused a drain, the same fault is not tried again for this long (the daemon
    jitters it): a fault every node keeps seeing asks for the partition's share once, not every check."""
    diagnostics: Diagnostics = field(default_factory=Diagnostics)
    """The active diagnostics in force: before_return gates healthd's resume, after_failure runs after its drain."""
    diagnostic_retry: float = DIAGNOSTIC_RETRY_S

    @classmethod
    def from_config(cls, config: HealthdConfig, node: str, diagnostics: Diagnostics | None = None) -> EngineSettings:
        """The engine's settings from healthd.toml (`node`: this node's Slurm name; `diagnostics`: those in force,
        healthd/diagnostic_runner.py `diagnostics_in_force`; default none)."""
        return cls(node=node, policy=config.policy, dedup_window=config.xid_dedup_window,
                   resume_when_clean=config.resume_when_clean, clean_checks=config.clean_checks,
                   breaker_max_share=config.breaker_max_share, partition=config.partition, dry_run=config.dry_run,
                   breaker_retry=config.breaker_retry, diagnostics=diagnostics or Diagnostics(),
                   diagnostic_retry=config.diagnostic_retry)


@dataclass(frozen=True)
class EngineState:
    """What healthd remembers between steps.  Never mutated: each step returns a new one."""

    history: tuple[Finding, ...] = ()
    """Xids seen on this node (from the Xid history file too), for the repeated-app-Xid rule."""
    current: Mapping[str, tuple[StateFinding, ...]] = field(default_factory=dict)
    """The last periodic check's findings by GPU index (or NODE_KEY): they hold until a check no longer sees them."""
    events: tuple[StateFinding, ...] = ()
    """Recent one-off findings worth a look (Xids, lost GPUs, hangs), oldest first."""
    alerts: tuple[Alert, ...] = ()
    node: NodeState | None = None
    """This node as Slurm last answered (None until it has)."""
    node_seen_at: float = 0.0
    """When Slurm gave that answer."""
    drain_outcome_at: float = 0.0
    """When the outcome of the last drain decision came back: a node view older than that predates it."""
    clean_checks: int = 0
    """Clean periodic checks in a row while drained by us (towards resume_when_clean)."""
    drain_in_flight: bool = False
    """A drain was planned and its outcome is not known yet: do not plan another."""
    refused: Mapping[tuple[object, ...], float] = field(default_factory=dict)
    """Fault (fault_key) → until when: the breaker refused draining for it; it is not tried again before then."""
    last_seen: Mapping[tuple[object, ...], float] = field(default_factory=dict)
    """De-duplication: when each (source, GPU, fault) was last let through."""
    next_id: int = 0
    diagnostics: Mapping[str, DiagnosticResult] = field(default_factory=dict)
    """The last result of each diagnostic level (from the diagnostic journal too, after a restart)."""
    diagnostics_running: frozenset[str] = frozenset()
    """Levels asked for and not yet reported: not asked again meanwhile."""
    return_note: str = ""
    """Why a node healthd drained has not returned yet (or which diagnostic let it), for the state file."""


@dataclass(frozen=True)
class Drain:
    """Journal, then apply: drain this node."""

    planned: PlannedAction


@dataclass(frozen=True)
class Resume:
    """Journal, then apply: resume this node (our own drain, checks clean again)."""

    planned: PlannedAction


@dataclass(frozen=True)
class Remember:
    """Append this Xid to the Xid history (it may count towards a repeat after a restart)."""

    sighting: XidSighting


@dataclass(frozen=True)
class RaiseAlert:
    """Tell an admin (log, metric, state file): healthd would not act by itself."""

    alert: Alert


@dataclass(frozen=True)
class Judged:
    """A finding and the policy's verdict on it (for logs and metrics)."""

    finding: Finding
    verdict: Verdict


@dataclass(frozen=True)
class RunDiagnostic:
    """Run this diagnostic (on the diagnostic thread) and report its result (`diagnosed`)."""

    level: Level
    spec: DiagnosticSpec


Effect = Drain | Resume | Remember | RaiseAlert | RunDiagnostic


@dataclass(frozen=True)
class Step:
    """The outcome of one step: the new state, the effects to carry out (in order), what was judged."""

    state: EngineState
    effects: tuple[Effect, ...] = ()
    judged: tuple[Judged, ...] = ()


# ---- the step ---------------------------------------------------------------------------------

def dedup_key(finding: Finding) -> tuple[object, ...] | None:
    """What makes two findings one fault for storm suppression (None: never suppressed).

    NVML events by GPU, kind and Xid; kernel-log lines by PCI address and Xid (the kernel
    names GPUs NVML may no longer see).  Periodic checks are not events: they are never suppressed.
    """
    if finding.source == "nvml-event":
        return ("nvml-event", finding.gpu, finding.kind, finding.xid)
    if finding.source == "kmsg":
        return ("kmsg", finding.value, finding.xid)
    return None


def fault_key(finding: Finding | StateFinding) -> tuple[object, ...]:
    """Which fault a finding is, whatever its source and time (kind, GPU, Xid): what the breaker's refusal holds back."""
    return (finding.kind, finding.gpu, finding.xid)


def is_duplicate(state: EngineState, settings: EngineSettings, finding: Finding) -> bool:
    """The same fault was let through less than `dedup_window` seconds ago."""
    key = dedup_key(finding)
    seen = state.last_seen.get(key) if key is not None else None
    return seen is not None and finding.at - seen < settings.dedup_window


def needs_jobs(state: EngineState, settings: EngineSettings, finding: Finding) -> bool:
    """This finding is an application-level Xid the step will judge: attach the jobs running here first.

    Such an Xid drains only when the same GPU repeats it across different jobs, so the
    jobs it happened in are evidence (the daemon asks Slurm only for these findings).
    """
    return (finding.kind == "xid" and finding.xid is not None and not is_duplicate(state, settings, finding)
            and judge(finding, (), settings.policy).action is Action.APP_FAULT)


def resume_allowed(reason: str, boot_time: float) -> bool:
    """Evidence rule for resuming our own drain once checks are clean again.

    drain-reset: clean checks are the evidence (the GPU was reset).  drain-reboot: only if
    the node booted after the drain.  drain-rma: never (the hardware must be replaced).
    A reason we cannot read is not ours to lift.
    """
    drain = parse_drain_reason(reason)
    if drain is None or drain.owner is not HEALTHD or drain.action is Action.DRAIN_RMA:
        return False
    if drain.action is Action.DRAIN_REBOOT:
        return boot_time > drain.at_seconds
    return True


def state_finding(finding: Finding, verdict: Verdict, *, current: bool = False) -> StateFinding:
    """How a judged finding is shown in the state file and journal."""
    return StateFinding(kind=finding.kind, action=verdict.action, reason=verdict.reason, source=finding.source,
                        at_ts=finding.at, xid=finding.xid, gpu=finding.gpu, uuid=finding.uuid,
                        detail=finding.detail, jobs=finding.job_ids, current=current)


def _plan(state: EngineState, settings: EngineSettings, op: str, reason: str, now: float,
          finding: StateFinding | None) -> tuple[EngineState, PlannedAction]:
    action = PlannedAction(f"{op}-{settings.node}-{int(now * 1e9)}-{state.next_id}", op, reason, now, finding)
    return replace(state, next_id=state.next_id + 1), action


def step(state: EngineState, settings: EngineSettings, source: str, findings: Sequence[Finding], now: float, *,
         node: NodeState | None = None, node_at: float | None = None, boot_time: float = 0.0) -> Step:
    """Judge one batch of findings from one source.

    `source` "periodic" is a whole periodic check: its findings replace the last check's,
    and a clean one counts towards resuming.  `node` is Slurm's answer taken with the
    batch (None: not asked, or Slurm did not answer; the last answer stands), taken at
    `node_at` (default `now`).
    `boot_time` is when this node booted (evidence for lifting a drain-reboot).
    """
    if node is not None:
        state = replace(state, node=node, node_seen_at=now if node_at is None else node_at)
    last_seen = dict(state.last_seen)
    history = state.history
    current: dict[str, tuple[StateFinding, ...]] = {} if source == "periodic" else dict(state.current)
    events = list(state.events)
    effects: list[Effect] = []
    judged: list[Judged] = []
    worst: tuple[Finding, Verdict] | None = None
    drains_seen = False
    for finding in findings:
        if is_duplicate(replace(state, last_seen=last_seen), settings, finding):
            continue
        key = dedup_key(finding)
        if key is not None:
            last_seen[key] = finding.at
        verdict = judge(finding, history, settings.policy)
        if finding.kind == "xid" and finding.xid is not None:
            history += (finding,)
            effects.append(Remember(XidSighting(finding.at, finding.xid, finding.source, finding.gpu, finding.uuid,
                                                finding.job_ids, finding.users)))
        judged.append(Judged(finding, verdict))
        where = str(finding.gpu) if finding.gpu is not None else NODE_KEY
        if source == "periodic":
            current[where] = current.get(where, ()) + (state_finding(finding, verdict, current=True),)
        elif verdict.action > Action.IGNORE:
            events = (events + [state_finding(finding, verdict)])[-RECENT_EVENTS:]
        if verdict.action.drains:
            drains_seen = True
            # A fault the breaker refused lately waits for its retry; any other may still be tried.
            if now >= state.refused.get(fault_key(finding), 0.0) and (worst is None or verdict.action > worst[1].action):
                worst = (finding, verdict)
    state = replace(state, history=_within_window(history, settings, now), current=current, events=tuple(events),
                    last_seen=_fresh_keys(last_seen, settings, now))
    if drains_seen:
        state = replace(state, clean_checks=0)
    if worst is not None:
        known_drained = state.node is not None and state.node.drained_by_us
        finding, verdict = worst
        if not state.drain_in_flight and not (source == "periodic" and known_drained):
            state, planned = _plan(state, settings, "drain", drain_reason(finding, verdict, now).render(), now,
                                   state_finding(finding, verdict))
            state = replace(state, drain_in_flight=True)
            effects.append(Drain(planned))
    elif source == "periodic" and not drains_seen:
        state, resume = _maybe_resume(state, settings, now, boot_time)
        effects += resume
    return Step(_acknowledge_if_back_in_service(state, now), tuple(effects), tuple(judged))


def _within_window(history: tuple[Finding, ...], settings: EngineSettings, now: float) -> tuple[Finding, ...]:
    # Older Xids can no longer count towards a repeat: forget them, and keep at most MAX_HISTORY.
    return tuple(f for f in history if now - f.at <= settings.policy.app_xid_window_s)[-MAX_HISTORY:]


def _fresh_keys(last_seen: Mapping[tuple[object, ...], float], settings: EngineSettings,
                now: float) -> dict[tuple[object, ...], float]:
    # A key older than the de-dup window suppresses nothing any more.
    fresh = sorted(((at, key) for key, at in last_seen.items() if now - at < settings.dedup_window),
                   key=lambda pair: pair[0])
    return {key: at for at, key in fresh[-MAX_DEDUP_KEYS:]}


def history_to_keep(sightings: Sequence[XidSighting], policy: PolicyConfig, now: float) -> tuple[XidSighting, ...]:
    """The Xid history a starting daemon keeps: what can still count towards a repeat, at most MAX_HISTORY."""
    return tuple(s for s in sightings if now - s.at <= policy.app_xid_window_s)[-MAX_HISTORY:]


def owner_of_gpu(gpu: int | None, starts: Sequence[JobStart], running: Sequence[str] | None) -> tuple[str, str] | None:
    """The (job id, uid or "") that owned GPU `gpu` when an Xid happened on it; None when not exactly one job did.

    `starts`: the prolog's notes of the jobs on this node (their GPUs and user); `running`: the
    jobs Slurm says run here (None: Slurm did not answer), which drops notes of jobs that ended
    without an epilog.  Without any note, a job alone on the node owns every GPU.  On a shared
    node only the job given that GPU owns it: the other jobs there had nothing to do with it.
    """
    live = [s for s in starts if running is None or s.job_id in running]
    if gpu is not None:
        owners = [s for s in live if s.gpus is None or gpu in s.gpus]
        if len(owners) == 1:
            return owners[0].job_id, str(owners[0].uid) if owners[0].uid is not None else ""
        if owners:
            return None
    if not live and running is not None and len(running) == 1:
        return running[0], ""
    return None


def _maybe_resume(state: EngineState, settings: EngineSettings, now: float,
                  boot_time: float) -> tuple[EngineState, list[Effect]]:
    node = state.node
    if not (settings.resume_when_clean and node is not None and node.drained_by_us):
        return replace(state, clean_checks=0, return_note=""), []
    if not resume_allowed(node.reason, boot_time):
        return state, []
    clean = state.clean_checks + 1
    if clean < settings.clean_checks:
        return replace(state, clean_checks=clean), []
    drain = parse_drain_reason(node.reason)
    spec = settings.diagnostics.before_return
    decision = return_decision(ReturnFacts(
        drain.at_seconds if drain is not None else now, spec, state.diagnostics.get("before_return"),
        "before_return" in state.diagnostics_running, now, boot_time, settings.diagnostic_retry))
    state = replace(state, return_note=decision.why)
    if not decision.resume:
        effects: list[Effect] = []
        if decision.run_diagnostic and spec is not None:
            state = replace(state, diagnostics_running=state.diagnostics_running | {"before_return"})
            effects.append(RunDiagnostic("before_return", spec))
        return replace(state, clean_checks=clean), effects
    state, planned = _plan(replace(state, clean_checks=0), settings, "resume", node.reason, now, None)
    return state, [Resume(planned)]


def diagnosed(state: EngineState, result: DiagnosticResult) -> EngineState:
    """Fold a diagnostic's result in (the shell has journaled it): the next clean check decides with it."""
    return replace(state, diagnostics={**state.diagnostics, result.level: result},
                   diagnostics_running=state.diagnostics_running - {result.level})


def watching_node(state: EngineState) -> bool:
    """The node's Slurm state decides something soon: it is drained (an admin's resume ends its
    events; healthd may resume its own drain), a drain is on its way, or drain-class events wait
    for the node to be back in service.  The daemon then reads it every drained_refresh_interval."""
    if state.drain_in_flight or (state.node is not None and state.node.draining):
        return True
    return any(e.action.drains and not e.acknowledged for e in state.events)


def _acknowledge_if_back_in_service(state: EngineState, now: float) -> EngineState:
    """Once the node is in service again, drain-class events before that are over (the prolog need not refuse).

    Only a view Slurm gave after the event and after the last drain outcome counts: a view
    taken while our drain was still on its way says "in service" and means nothing.
    """
    seen = state.node_seen_at
    if state.node is None or state.node.draining or state.drain_in_flight or seen <= state.drain_outcome_at:
        return state
    events = tuple(replace(e, acknowledged=True) if e.action.drains and not e.acknowledged and e.at_ts < seen - 1
                   else e for e in state.events)
    if events == state.events:
        return state
    # Back in service: the same fault again is a new fault, not part of the old storm.
    return replace(state, events=events, last_seen={})


# ---- applying a planned action ----------------------------------------------------------------

@dataclass(frozen=True)
class ApplyDecision:
    """What the drain door decided for a planned action (healthd/drain_requests.py), and what to journal as its
    outcome (healthd's own actions never meet "bad-node-name" nor "not-owners-reason")."""

    result: drains.DrainResult
    call: drains.DrainCall | None = None
    """The Slurm call made; None: nothing."""
    alert: Alert | None = None


def applied(state: EngineState, action: PlannedAction, decision: ApplyDecision, now: float,
            retry_after: float = 0.0, node: NodeState | None = None,
            after_failure: DiagnosticSpec | None = None) -> Step:
    """Fold the outcome of an applied action back in.

    After a drain decision (whatever its outcome: drained, kept an admin's drain, breaker)
    the events up to it are handled: healthd has acted on them.  When the breaker refused, the
    same fault is not tried again for `retry_after` seconds (settings.breaker_retry, jittered by
    the caller); another fault is.
    `node`: the node as the applied call left it (drained, resumed), so no new read is needed.
    `after_failure`: the diagnostic to run once healthd's drain is in place (settings.diagnostics), if any.
    """
    alerts = state.alerts
    effects: tuple[Effect, ...] = ()
    if node is not None:
        state = replace(state, node=node, node_seen_at=now)
    if decision.alert is not None:
        alerts = (alerts + (decision.alert,))[-RECENT_ALERTS:]
        effects = (RaiseAlert(decision.alert),)
    # Alerts older than a day are history, not something to look at now.
    alerts = tuple(a for a in alerts if now - (parse_utc(a.at) or now) <= ALERT_WINDOW_S)
    if action.op == "drain":
        events = tuple(replace(e, handled=True) if e.at_ts <= action.at + 1e-3 else e for e in state.events)
        state = replace(state, events=events, drain_in_flight=False, drain_outcome_at=now)
        if decision.result == "drained" and after_failure is not None \
                and "after_failure" not in state.diagnostics_running:
            state = replace(state, diagnostics_running=state.diagnostics_running | {"after_failure"})
            effects += (RunDiagnostic("after_failure", after_failure),)
        if decision.result == "breaker-open" and action.finding is not None:
            refused = {k: until for k, until in state.refused.items() if until > now}
            refused[fault_key(action.finding)] = now + retry_after
            state = replace(state, refused=dict(list(refused.items())[-MAX_DEDUP_KEYS:]))
    return Step(replace(state, alerts=alerts), effects)


def restore(sightings: Sequence[XidSighting], diagnostics: Sequence[DiagnosticResult] = ()) -> EngineState:
    """The state a starting daemon begins with: its Xid history and each diagnostic level's last result."""
    return EngineState(history=tuple(Finding("xid", s.source, s.at, gpu=s.gpu, uuid=s.uuid, xid=s.xid,
                                             job_ids=s.job_ids, users=s.users) for s in sightings),
                       diagnostics={result.level: result for result in diagnostics})


# ---- what the state file shows ----------------------------------------------------------------

@dataclass(frozen=True)
class GpuIdentityView:
    """A GPU's identity as NVML told it (empty for a GPU lost before healthd started)."""

    uuid: str = ""
    pci_bus: str = ""


def state_view(state: EngineState, *, node: str, pid: int, started: float, now: float, nvml_ok: bool,
               identities: Mapping[int, GpuIdentityView], gpu_count: int, pending_actions: int,
               loop_age_s: Mapping[str, float], dry_run: bool) -> HealthdState:
    """The state file's contents: per GPU the last check's findings plus recent events not yet over."""
    live = [e for e in state.events if not e.acknowledged]
    gpus = []
    # GPUs lost before healthd started have no identity (NVML cannot tell it) but still get a row.
    seen = {f.gpu for f in live if f.gpu is not None} | {int(k) for k in state.current if k.isdigit()}
    for index in sorted(set(identities) | set(range(gpu_count)) | seen):
        identity = identities.get(index) or GpuIdentityView()
        findings = state.current.get(str(index), ()) + tuple(e for e in live if e.gpu == index)
        gpus.append(GpuState(index, identity.uuid, identity.pci_bus, findings))
    node_findings = state.current.get(NODE_KEY, ()) + tuple(e for e in live if e.gpu is None)
    return HealthdState(node=node, pid=pid, policy_version=POLICY_VERSION, updated_at=now, started=utc(started),
                        nvml_ok=nvml_ok, gpus=tuple(gpus), node_findings=node_findings,
                        pending_actions=pending_actions, slurm=state.node, alerts=state.alerts,
                        loop_age_s=dict(loop_age_s), dry_run=dry_run, return_note=state.return_note)


# ---- the hooks: the same policy at a job's edges ---------------------------------------------

def blocks_new_work(action: Action) -> bool:
    """A GPU needing a drain, or a reset before its next job (pending remap/retirement), takes no job."""
    return action.drains or action is Action.RESET_AT_IDLE


def gate_verdict(finding: Finding, policy: PolicyConfig) -> Verdict:
    """The verdict at a job's start: the policy's, except that a driver which hangs or errors
    right then makes the node no place to start a job (drain-reset)."""
    verdict = judge(finding, (), policy)
    if finding.kind in ("nvml-hang", "nvml-error") and not blocks_new_work(verdict.action):
        return Verdict(Action.DRAIN_RESET, verdict.reason, verdict.rule)
    return verdict


def blocking_in_state(state: HealthdState, gpus: Sequence[int] | None) -> list[tuple[Finding, Verdict]]:
    """Blocking verdicts healthd holds for these GPUs (None: all) and the node as a whole.

    Findings healthd has acted on (`handled`) or that are over (`acknowledged`) are left to
    Slurm's node state; current findings of the last check always count.
    """
    out = []
    for finding in state.findings():
        if gpus is not None and finding.gpu is not None and finding.gpu not in gpus:
            continue
        if blocks_new_work(finding.action) and not finding.handled and not finding.acknowledged:
            out.append((Finding(finding.kind, "healthd", finding.at_ts, gpu=finding.gpu, uuid=finding.uuid,
                                xid=finding.xid, detail=finding.detail),
                        Verdict(finding.action, finding.reason, "healthd state")))
    return out
