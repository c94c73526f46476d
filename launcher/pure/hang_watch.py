"""Hung ranks: which ranks stopped progressing, on which node, and the evidence that says so.  (pure)

Each rank reports its step and phase (clusterctl.progress.beat → `<job_dir>/progress/<rank>.json`),
or the program logs its steps and the caller parses them (`progress_from_log_line`).  The watch
learns the job's step time from those reports (the median of the last `step_window` per-step
durations) and gives each rank a timeout by its phase:

- start-up (no report yet, phase `startup`, or the first `warmup_steps` steps of this launch, or
  no step time learned yet): `startup_timeout`;
- `checkpoint-save` / `checkpoint-load`: `checkpoint_timeout`;
- `step`: `safety_factor` × the learned step time, kept within [`min_step_timeout`, `max_step_timeout`].

A rank silent past its timeout is stuck, except that while another rank is legitimately busy
(starting, warming up, checkpointing, within its own timeout) the ranks merely waiting for it in the
step phase are not: rank 0 saving alone holds every other rank in a barrier.

In a data-parallel job one hung rank soon stops every rank (they wait for it in the next
collective), so "every rank is silent" is the usual sight of a hang.  Then, when the reports say
which processes still run (`alive_at`, from clusterctl.progress's liveness thread), the ranks
whose processes stopped running `liveness_gap` before the others' latest sign of life are the
suspects (a SIGSTOPped or wedged process; the others wait for it).  Otherwise the ranks that went
silent well before the rest (`silence_gap`, or that never reported while others did) are the
suspects; when every rank stopped together (a shared-filesystem or network stall, or a hang too fast
to tell apart) the verdict is `whole_job` and names no node.

Times are epoch seconds: a report's `at` is the rank's clock and `now` the caller's, so the hosts'
clocks must agree to well within `min_step_timeout` (Slurm and munge already need synchronised clocks).
Nothing here reads a clock or a file: the caller passes the reports and the time in.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from clusterctl.errors import HostlistError
from clusterctl.launcher.pure.classify import Blame
from clusterctl.launcher.pure.in_parts import PART_RECORDS, Parts, to_the_end
from clusterctl.records.rank_progress import RankProgress
from clusterctl.slurm import hostlist

HANG_REASON = "hung ranks: no progress within their timeout"
"""The `reason` of a Blame for a node whose ranks hung (see HangVerdict.blames)."""


@dataclass(frozen=True)
class HangPolicy:
    """How long a rank may go without progress in each phase before it counts as hung (seconds)."""

    startup_timeout: float = 600.0
    """From the step's launch to a rank's first report, and through the warm-up steps: imports, data
    loading, NCCL set-up and the first (compiling) steps are slow and vary."""
    checkpoint_timeout: float = 900.0
    """For a rank reporting `checkpoint-save` or `checkpoint-load` (and the ranks waiting for it)."""
    safety_factor: float = 5.0
    """The step-phase timeout is this many times the learned step time."""
    min_step_timeout: float = 30.0
    """Floor of the step-phase timeout: above the report interval and the jitter of a fast step."""
    max_step_timeout: float = 1800.0
    """Ceiling of the step-phase timeout, whatever was learned."""
    warmup_steps: int = 3
    """The first steps of each launch are judged with the start-up timeout, and not learned from."""
    step_window: int = 50
    """How many recent per-step durations the learned step time is the median of."""
    silence_gap: float = 5.0
    """When every rank is silent, a rank is a suspect only if it went silent this much earlier than the
    newest report of the job; more than the report interval (clusterctl.progress, 1 s by default),
    so rate-limited reports of ranks stepping together are never told apart by chance."""
    liveness_gap: float = 3.0
    """When every rank is silent, a rank whose process last showed life (`alive_at`) this much before
    the others' latest has frozen: a few of clusterctl.progress's liveness intervals (1 s by default)."""

    def __post_init__(self) -> None:
        if min(self.startup_timeout, self.checkpoint_timeout, self.min_step_timeout, self.safety_factor) <= 0:
            raise ValueError("hang timeouts and the safety factor must be positive")
        if self.min_step_timeout > self.max_step_timeout:
            raise ValueError(f"min_step_timeout {self.min_step_timeout:g} s exceeds max_step_timeout "
                             f"{self.max_step_timeout:g} s")
        if self.warmup_steps < 0 or self.step_window < 1 or self.silence_gap < 0 or self.liveness_gap <= 0:
            raise ValueError("warmup_steps and silence_gap must be >= 0, liveness_gap > 0, step_window >= 1")


@dataclass(frozen=True)
class StepTimes:
    """What the watch has learned of the job's step time: recent per-step durations, newest last."""

    recent: tuple[float, ...] = ()
    window: int = 50

    @property
    def learned(self) -> float | None:
        """The typical step time (median of the recent durations, robust to a checkpoint or a slow
        step among them); None before anything was learned."""
        return statistics.median(self.recent) if self.recent else None

    def with_sample(self, seconds_per_step: float) -> StepTimes:
        """These times with one more observed per-step duration (the oldest drops out of the window)."""
        return self.with_samples((seconds_per_step,))

    def with_samples(self, seconds_per_step: Sequence[float]) -> StepTimes:
        """These times with more observed per-step durations, oldest first (the window keeps the newest)."""
        if not seconds_per_step:
            return self
        return replace(self, recent=(*self.recent, *seconds_per_step[-self.window:])[-self.window:])

    def learn(self, before: RankProgress | None, after: RankProgress, warmup_until: int) -> StepTimes:
        """Learn from two successive reports of one rank: the time per step between them.

        Only step-phase reports that advanced, both past the warm-up (`before.step >= warmup_until`);
        a step number that went back (the program restarted) teaches nothing.
        """
        sample = seconds_per_step(before, after, warmup_until)
        return self if sample is None else self.with_sample(sample)


def seconds_per_step(before: RankProgress | None, after: RankProgress, warmup_until: int) -> float | None:
    """The time per step between two successive reports of one rank (see StepTimes.learn), or None."""
    if (before is None or before.phase != "step" or after.phase != "step" or before.step < warmup_until
            or after.step <= before.step or after.at <= before.at):
        return None
    return (after.at - before.at) / (after.step - before.step)


@dataclass(frozen=True)
class PhaseTimeout:
    """How long a rank may stay silent now, which rule gave it, and how to say so."""

    seconds: float
    kind: str  # "startup", "warmup", "unlearned", "checkpoint" or "step"
    why: str  # e.g. "timeout 60 s learned from median step 12 s × 5"


def step_timeout(policy: HangPolicy, learned_step: float) -> float:
    """The step-phase timeout for a learned step time: safety_factor × it, within [min, max]."""
    return min(max(policy.safety_factor * learned_step, policy.min_step_timeout), policy.max_step_timeout)


def phase_timeout(policy: HangPolicy, step_times: StepTimes, phase: str, steps_into_launch: int) -> PhaseTimeout:
    """The timeout of a rank in `phase`, `steps_into_launch` steps after its first step of this launch."""
    startup = _seconds(policy.startup_timeout)
    if phase == "startup":
        return PhaseTimeout(policy.startup_timeout, "startup", f"start-up timeout {startup} s")
    if phase in ("checkpoint-save", "checkpoint-load"):
        return PhaseTimeout(policy.checkpoint_timeout, "checkpoint",
                            f"checkpoint timeout {_seconds(policy.checkpoint_timeout)} s")
    if steps_into_launch < policy.warmup_steps:
        return PhaseTimeout(policy.startup_timeout, "warmup",
                            f"start-up timeout {startup} s (within the first {policy.warmup_steps} warm-up steps)")
    learned = step_times.learned
    if learned is None:
        return PhaseTimeout(policy.startup_timeout, "unlearned", f"start-up timeout {startup} s (no step time "
                                                                 "learned yet)")
    seconds = step_timeout(policy, learned)
    why = f"timeout {_seconds(seconds)} s learned from median step {_seconds(learned)} s × {policy.safety_factor:g}"
    if seconds == policy.min_step_timeout and policy.safety_factor * learned < seconds:
        why += f", raised to the {_seconds(seconds)} s minimum"
    elif seconds == policy.max_step_timeout and policy.safety_factor * learned > seconds:
        why += f", capped at the {_seconds(seconds)} s maximum"
    return PhaseTimeout(seconds, "step", why)


@dataclass(frozen=True)
class LoggedStep:
    """The newest step the job's log showed (for programs that only log), and the first one of this launch."""

    step: int
    at: float
    first_step: int


class RankState(NamedTuple):
    """One rank as judged: its last report of this launch (None: never reported), timeout and silence.
    A tuple, not a dataclass: a verdict at 100,000 ranks makes one per rank."""

    rank: int
    node: str
    report: RankProgress | None
    timeout: PhaseTimeout
    silent_for: float

    @property
    def overdue(self) -> bool:
        """Silent for longer than its phase allows."""
        return self.silent_for > self.timeout.seconds


@dataclass(frozen=True)
class StuckNode:
    """A node named as the place of a hang, its stuck ranks, and the evidence in one line."""

    node: str
    ranks: tuple[int, ...]
    evidence: str


@dataclass(frozen=True)
class HangVerdict:
    """The watch's judgement at one moment.

    `hung`: some rank stopped progressing past its timeout.  `suspects`: the nodes to blame (empty
    when `whole_job`: every rank stopped together, nothing tells one node apart).  `evidence`: one
    line per suspect node, or one line for the whole job.
    """

    hung: bool
    whole_job: bool = False
    suspects: tuple[StuckNode, ...] = ()
    stuck_ranks: tuple[int, ...] = ()
    evidence: tuple[str, ...] = ()

    @property
    def suspect_nodes(self) -> tuple[str, ...]:
        """The names of the suspect nodes, in order."""
        return tuple(suspect.node for suspect in self.suspects)

    def blames(self) -> tuple[Blame, ...]:
        """The suspects as the launcher blames nodes (empty for a whole-job stall)."""
        return tuple(Blame(s.node, HANG_REASON, (s.evidence,)) for s in self.suspects)


def progress_from_log_line(line: str, pattern: str | re.Pattern[str]) -> int | None:
    """The step a log line reports, or None: `pattern`'s group `step` if it has one, else its first
    group, else the whole match, read as an integer (e.g. r"step (\\d+)" or r"it=(?P<step>\\d+)")."""
    match = re.search(pattern, line)
    if match is None:
        return None
    if "step" in match.re.groupindex:
        text = match.group("step")
    elif match.re.groups:
        text = match.group(1)
    else:
        text = match.group(0)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def judge(progress_records: Iterable[RankProgress], policy: HangPolicy, now: float, started_at: float, *,
          expected_ranks: Mapping[int, str] | None = None, step_times: StepTimes | None = None,
          first_steps: Mapping[int, int] | None = None, logged: LoggedStep | None = None) -> HangVerdict:
    """Which ranks are hung at `now`, in a step launched at `started_at` (epoch seconds).

    `expected_ranks`: rank → node from the rank map, so a rank that never reported is judged too
    (without it only the ranks that reported are).  `step_times`: what was learned so far (nothing:
    the step phase uses the start-up timeout).  `first_steps`: each rank's first step of this launch,
    for the warm-up (missing: counted from step 0).  `logged`: the newest step the job's log showed,
    progress for every rank.  Reports older than `started_at` belong to an earlier launch: ignored.
    """
    return to_the_end(judging(progress_records, policy, now, started_at, expected_ranks=expected_ranks,
                              step_times=step_times, first_steps=first_steps, logged=logged))


def judging(progress_records: Iterable[RankProgress], policy: HangPolicy, now: float, started_at: float, *,
            expected_ranks: Mapping[int, str] | None = None, step_times: StepTimes | None = None,
            first_steps: Mapping[int, int] | None = None, logged: LoggedStep | None = None) -> Parts[HangVerdict]:
    """`judge` in parts of PART_RECORDS ranks (launcher/pure/in_parts.py); returns the same verdict."""
    times = step_times if step_times is not None else StepTimes(window=policy.step_window)
    states = yield from _rank_states(progress_records, policy, now, started_at, expected_ranks or {}, times,
                                     first_steps or {}, logged)
    if not states:
        return HangVerdict(False)
    yield
    overdue = [s for s in states if s.overdue]
    # A rank starting, warming up or checkpointing within its timeout may hold the others in a
    # collective or barrier: those merely waiting in the step phase are not hung (yet).
    busy = any(not s.overdue and s.timeout.kind != "step" for s in states)
    stuck = [s for s in overdue if not (busy and s.timeout.kind == "step")]
    if not stuck:
        return HangVerdict(False)
    yield
    stuck_ranks = tuple(s.rank for s in stuck)
    if len(stuck) < len(states):
        stuck_set = set(stuck_ranks)  # by rank: comparing whole states is quadratic at 100,000 ranks
        if _silent_together(stuck, [s for s in states if s.rank not in stuck_set], policy):
            return HangVerdict(False)  # the rest crosses its timeout within silence_gap: judged then
        suspects = tuple(_stuck_node(node, group, now) for node, group in _by_node(stuck))
        return HangVerdict(True, False, suspects, stuck_ranks, tuple(s.evidence for s in suspects))
    return _every_rank_silent(states, policy, now, started_at, stuck_ranks)


@dataclass(frozen=True)
class HangWatch:
    """The hang watch of one launched step, carried from one poll to the next (each call returns a new one).

    Each poll: `watch = watch.observe(read_progress(job_dir)[0])` (and `observe_log_step` for steps
    parsed from the log), then `watch.verdict(now)`.
    """

    policy: HangPolicy
    started_at: float
    expected_ranks: Mapping[int, str] = field(default_factory=dict)
    step_times: StepTimes = field(default_factory=StepTimes)
    latest: Mapping[int, RankProgress] = field(default_factory=dict)
    first_steps: Mapping[int, int] = field(default_factory=dict)
    logged: LoggedStep | None = None

    @classmethod
    def start(cls, policy: HangPolicy, started_at: float, expected_ranks: Mapping[int, str] | None = None) -> HangWatch:
        """A watch for a step launched at `started_at`, whose rank map puts rank r on `expected_ranks[r]`."""
        return cls(policy, started_at, dict(expected_ranks or {}), StepTimes(window=policy.step_window))

    def observe(self, records: Iterable[RankProgress]) -> HangWatch:
        """The watch after reading these reports: newest report per rank, and step times learned.

        Only the records that changed need be passed: a rank's record seen before teaches nothing."""
        return to_the_end(self.observing(records))

    def observing(self, records: Iterable[RankProgress]) -> Parts[HangWatch]:
        """`observe` in parts of PART_RECORDS records (launcher/pure/in_parts.py); returns the same watch."""
        latest, first_steps = dict(self.latest), dict(self.first_steps)
        warmup, started_at = self.policy.warmup_steps, self.started_at
        samples: list[float] = []  # learned in one go: at 100,000 ranks a new StepTimes per report costs seconds
        for count, record in enumerate(records, 1):
            if count % PART_RECORDS == 0:
                yield
            rank = record.rank
            before = latest.get(rank)
            if record.at < started_at or (before is not None and before.at == record.at and before == record):
                continue  # (the times first: comparing whole records is most of this loop at 100,000 ranks)
            if record.phase == "step":
                first_steps.setdefault(rank, record.step)
            sample = seconds_per_step(before, record, first_steps.get(rank, 0) + warmup)
            if sample is not None:
                samples.append(sample)
            latest[rank] = record
        return replace(self, latest=latest, first_steps=first_steps, step_times=self.step_times.with_samples(samples))

    def observe_log_step(self, step: int, at: float) -> HangWatch:
        """The watch after the job's log showed `step` at `at` (progress of every rank, learned from too)."""
        if at < self.started_at:
            return self
        before = self.logged
        first = before.first_step if before is not None else step
        times = self.step_times
        if before is not None:
            times = times.learn(_as_report(before, -1, ""), RankProgress(-1, "", step, "step", at, 0),
                                first + self.policy.warmup_steps)
        return replace(self, logged=LoggedStep(step, at, first), step_times=times)

    def verdict(self, now: float) -> HangVerdict:
        """Which ranks are hung at `now` (see `judge`)."""
        return to_the_end(self.verdicting(now))

    def verdicting(self, now: float) -> Parts[HangVerdict]:
        """`verdict` in parts of PART_RECORDS ranks (launcher/pure/in_parts.py); returns the same verdict."""
        if not self._may_be_overdue(now):
            return HangVerdict(False)
        yield
        return (yield from judging(self.latest.values(), self.policy, now, self.started_at,
                                   expected_ranks=self.expected_ranks, step_times=self.step_times,
                                   first_steps=self.first_steps, logged=self.logged))


    def _may_be_overdue(self, now: float) -> bool:
        """Whether some rank may be past its timeout at `now`; False only when `judge` would find none.

        Every timeout is at least the shortest of the start-up, checkpoint and step floors, and no rank
        has been silent longer than since the oldest report held (or the launch, for a rank not heard
        from): at 100,000 ranks this look costs milliseconds where a judgement costs tenths of a second."""
        policy = self.policy
        shortest = min(policy.startup_timeout, policy.checkpoint_timeout, policy.min_step_timeout)
        latest = self.latest
        if not latest or any(rank not in latest for rank in self.expected_ranks):
            oldest = self.started_at
        else:
            oldest = min(record.at for record in latest.values())
        return now - oldest > shortest


# ---- the parts of a judgement ------------------------------------------------------------------------

def _as_report(logged: LoggedStep, rank: int, node: str) -> RankProgress:
    return RankProgress(rank, node, logged.step, "step", logged.at, 0)


def _rank_states(records: Iterable[RankProgress], policy: HangPolicy, now: float, started_at: float,
                 expected: Mapping[int, str], times: StepTimes, first_steps: Mapping[int, int],
                 logged: LoggedStep | None) -> Parts[list[RankState]]:
    reports = {r.rank: r for r in records if r.at >= started_at and (not expected or r.rank in expected)}
    ranks = sorted(set(expected) | set(reports))
    yield
    states = []
    never = PhaseTimeout(policy.startup_timeout, "startup", f"start-up timeout {_seconds(policy.startup_timeout)} s")
    # A rank's timeout depends only on its phase and whether it is still warming up: computed once
    # for each such pair, not once per rank (at 100,000 ranks that is most of a verdict's time).
    timeouts: dict[tuple[str, bool], PhaseTimeout] = {}
    warmup = policy.warmup_steps
    for count, rank in enumerate(ranks, 1):
        if count % PART_RECORDS == 0:
            yield
        report = reports.get(rank)
        node = report.node if report is not None else expected[rank]
        first = first_steps.get(rank, 0)
        if logged is not None and logged.at >= started_at and (report is None or logged.at > report.at):
            report, first = _as_report(logged, rank, node), logged.first_step
        if report is None:
            states.append(RankState(rank, node, None, never, max(0.0, now - started_at)))
            continue
        into = report.step - first
        key = (report.phase, into < warmup)
        timeout = timeouts.get(key)
        if timeout is None:
            timeout = timeouts[key] = phase_timeout(policy, times, report.phase, into)
        states.append(RankState(rank, node, report, timeout, max(0.0, now - report.at)))
    return states


def _silent_together(stuck: Sequence[RankState], others: Sequence[RankState], policy: HangPolicy) -> bool:
    """The ranks not yet past their timeout went silent with the stuck ones: their newest report is
    less than `silence_gap` newer.  Reports are rate-limited (and a phase change is written at
    once), so ranks stopping together in one collective stop reporting up to an interval apart;
    telling them apart before all are overdue would blame the ranks that happened to report first."""
    if any(s.report is None for s in [*stuck, *others]):
        return False
    stuck_last = max(s.report.at for s in stuck if s.report is not None)
    others_last = max(s.report.at for s in others if s.report is not None)
    return others_last < stuck_last + policy.silence_gap


def _every_rank_silent(states: Sequence[RankState], policy: HangPolicy, now: float, started_at: float,
                       stuck_ranks: tuple[int, ...]) -> HangVerdict:
    everyone = f"{ranks_text(s.rank for s in states)} on {_nodes_text(s.node for s in states)}"
    reported = [s for s in states if s.report is not None]
    if not reported:
        line = (f"no rank ({everyone}) has reported progress in {_seconds(now - started_at)} s since the step "
                f"started; {states[0].timeout.why}; does the program call clusterctl.progress.beat or log its "
                "steps? No node to blame")
        return HangVerdict(True, True, (), stuck_ranks, (line,))
    frozen = _frozen(states, policy)
    if frozen is not None:
        return frozen
    newest = max(reported, key=lambda s: s.report.at if s.report else 0.0)
    assert newest.report is not None
    newest_at = newest.report.at
    silent_first = [s for s in states if s.report is None or s.report.at < newest_at - policy.silence_gap]
    silent_first_nodes = {s.node for s in silent_first}
    if silent_first and silent_first_nodes != {s.node for s in states}:
        suspects = []
        for node, group in _by_node(silent_first):
            stuck = _stuck_node(node, group, now)
            last = max((s.report.at for s in group if s.report is not None), default=None)
            if last is None:
                others = f"every other rank reported, last {_seconds(now - newest_at)} s ago"
            else:
                others = (f"every other rank kept reporting until {_seconds(newest_at - last)} s later "
                          "(then waited on these, it seems)")
            suspects.append(replace(stuck, evidence=f"{stuck.evidence}; {others}"))
        return HangVerdict(True, False, tuple(suspects), stuck_ranks, tuple(s.evidence for s in suspects))
    report = newest.report
    line = (f"every rank ({everyone}) silent: the newest report, step {report.step} (phase {report.phase}) "
            f"from rank {report.rank}, is {_seconds(now - newest_at)} s old; {newest.timeout.why}; "
            f"{_liveness_text(states, now)}the whole job stopped at once (a shared-filesystem or network stall?), "
            "no node to blame")
    return HangVerdict(True, True, (), stuck_ranks, (line,))


def _frozen(states: Sequence[RankState], policy: HangPolicy) -> HangVerdict | None:
    """Every rank stopped stepping, but only some stopped running: their processes (SIGSTOPped, wedged
    in the kernel, a C call holding the interpreter) froze, and the others wait for them in a
    collective.  Judged from the reports' `alive_at` (clusterctl.progress's liveness thread); None
    when that does not tell ranks apart (no liveness reports, or every process alive or frozen alike)."""
    alive = [s.report.alive_at for s in states if s.report is not None and s.report.alive_at > 0]
    if len(alive) < len(states):
        return None  # some rank gives no liveness: absence proves nothing
    newest = max(alive)
    stopped = [s for s in states if s.report is not None and s.report.alive_at < newest - policy.liveness_gap]
    if not stopped or len(stopped) == len(states):
        return None
    suspects = []
    for node, group in _by_node(stopped):
        last = max(s.report.alive_at for s in group if s.report is not None)
        ranks = ranks_text(s.rank for s in group)
        evidence = (f"every rank stopped stepping, but {ranks} on {node} also stopped running: their processes "
                    f"last showed life {_seconds(newest - last)} s before the other ranks' latest, which are alive "
                    "and waiting (in a collective, it seems)")
        suspects.append(StuckNode(node, tuple(s.rank for s in group), evidence))
    return HangVerdict(True, False, tuple(suspects), tuple(s.rank for s in states), tuple(s.evidence for s in suspects))


def _liveness_text(states: Sequence[RankState], now: float) -> str:
    """What the liveness reports say when they did not single out frozen ranks: every process alive,
    every one frozen, or too close to tell apart (an admin reads why no node was named)."""
    alive = [s.report.alive_at for s in states if s.report is not None and s.report.alive_at > 0]
    if not alive or len(alive) < len(states):
        return ""
    newest, oldest = now - max(alive), now - min(alive)
    ages = f"{_seconds(newest)} s ago" if _seconds(newest) == _seconds(oldest) else \
        f"{_seconds(newest)}-{_seconds(oldest)} s ago"
    return f"every rank's process last showed life {ages} (liveness), none apart from the others; "


def _stuck_node(node: str, group: Sequence[RankState], now: float) -> StuckNode:
    ranks = tuple(s.rank for s in group)
    clauses = []
    silent = [s for s in group if s.report is None]
    if silent:
        clauses.append(f"{ranks_text(s.rank for s in silent)} on {node} never reported progress in "
                       f"{_seconds(silent[0].silent_for)} s since the step started; {silent[0].timeout.why}")
    spoke = [s for s in group if s.report is not None]
    if spoke:
        steps = sorted({s.report.step for s in spoke if s.report is not None})
        phases = ", ".join(sorted({s.report.phase for s in spoke if s.report is not None}))
        step_text = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
        freshest = min(spoke, key=lambda s: s.silent_for)
        clauses.append(f"{ranks_text(s.rank for s in spoke)} on {node} last reported {step_text} (phase {phases}) "
                       f"{_seconds(freshest.silent_for)} s ago; {freshest.timeout.why}")
    return StuckNode(node, ranks, "; ".join(clauses))


def _by_node(states: Iterable[RankState]) -> list[tuple[str, list[RankState]]]:
    groups: dict[str, list[RankState]] = {}
    for state in sorted(states, key=lambda s: s.rank):
        groups.setdefault(state.node, []).append(state)
    return list(groups.items())


def ranks_text(ranks: Iterable[int]) -> str:
    """`rank 3`, `ranks 0-7`, `ranks 0,2-3`: ranks as people read them."""
    ordered = sorted(set(ranks))
    spans: list[str] = []
    start = previous = ordered[0]
    for rank in [*ordered[1:], None]:
        if rank is not None and rank == previous + 1:
            previous = rank
            continue
        spans.append(str(start) if start == previous else f"{start}-{previous}")
        if rank is not None:
            start = previous = rank
    return f"{'rank' if len(ordered) == 1 else 'ranks'} {','.join(spans)}"


def _nodes_text(nodes: Iterable[str]) -> str:
    # Numbered names in numeric order (node2 before node10), as Slurm lists them.
    unique = sorted(set(nodes), key=lambda name: (name.rstrip("0123456789"), len(name), name))
    try:
        return hostlist.compress(unique)
    except HostlistError:
        return ",".join(unique)


def _seconds(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.3g}"
