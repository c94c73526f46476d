"""`clusterctl report RUN`: attempts, blame with evidence, checkpoints and goodput (pure).

The caller reads the journal and lists the checkpoints (see
`clusterctl.launcher.login.use_cases.gather_report`); this module only accounts and renders.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from clusterctl.launcher.pure.checkpoint import Checkpoint, Skipped
from clusterctl.launcher.pure.goodput import AttemptTimes, InAllocationRestart, account
from clusterctl.launcher.pure.restart_policy import replay
from clusterctl.launcher.login.status import stragglers_of
from clusterctl.records.run_journal import OutcomeKind, RecoveredInAllocation, RunEvent


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def run_report(run_path: Path, events: Sequence[RunEvent], checkpoints: Sequence[Checkpoint],
               skipped: Sequence[Skipped], now: float, slow_node_seconds: float = 0.0) -> dict[str, Any]:
    """The report of the run at `run_path` as a JSON-ready dict, from its journal's `events`, the
    complete `checkpoints` (oldest first) and `skipped` ones found in its checkpoint directory, and
    the seconds its jobs lost to slow nodes (their step-time tables)."""
    state = replay(events)
    times = []
    attempts = []
    for a in state.attempts:
        d = a.decided
        t = d.times if d is not None else None
        # The journal's sbatch time is sub-second; Slurm's times are whole seconds.
        times.append(AttemptTimes(a.number, a.submitted_at or (t.submit if t else None) or 0.0,
                                  (t.start if t else None) or 0.0, (t.end if t else None) or 0.0,
                                  d is not None and d.outcome != OutcomeKind.COMPLETED,
                                  d is not None and d.outcome == OutcomeKind.NODE_FAILURE))
        attempts.append({"attempt": a.number, "job_id": a.job_id, "state": d.state if d else "running",
                         "outcome": str(d.outcome) if d else None, "message": d.message if d else None,
                         "blame": [b.to_json() for b in d.blame] if d else [],
                         "checkpoint_step": d.checkpoint_step if d else None,
                         "action": str(d.action) if d else None})
    recoveries = [e for e in events if isinstance(e, RecoveredInAllocation)]
    goodput = account(times, list(checkpoints), now,
                      [InAllocationRestart(e.at, sum(seconds for _, seconds in e.phases)) for e in recoveries],
                      slow_node_seconds)
    return {"run": str(run_path), "state": str(state.ended.kind) if state.ended else "running",
            "message": state.ended.message if state.ended else "",
            "attempts": attempts, "excluded_now": state.excluded(now),
            "in_allocation": [{"job_id": e.job_id, "restart": e.restart, "blame": [b.to_json() for b in e.blame],
                               "given_back": list(e.given_back), "nodes": list(e.nodes),
                               "checkpoint_step": e.checkpoint_step, "phases": dict(e.phases), "reason": e.reason}
                              for e in recoveries],
            "stragglers": stragglers_of(events),
            "checkpoints": {"complete": len(checkpoints), "latest_step": checkpoints[-1].step if checkpoints else None,
                            "skipped": [{"path": s.path, "why": s.why} for s in skipped]},
            "goodput": goodput.to_json()}


def report_renderables(report: dict[str, Any]) -> Group:
    """The report for a terminal."""
    g = report["goodput"]
    parts: list[RenderableType] = [Text.assemble(("run ", "bold"), report["run"], "  ", (report["state"], "bold"),
                                 f"  {report['message']}" if report["message"] else "")]
    table = Table(box=None, pad_edge=False)
    for column in ("attempt", "job", "ended", "outcome", "checkpoint", "decision"):
        table.add_column(column)
    for a in report["attempts"]:
        table.add_row(str(a["attempt"]), str(a["job_id"]), a["state"], a["outcome"] or "-",
                      str(a["checkpoint_step"]) if a["checkpoint_step"] is not None else "-", a["action"] or "-")
    parts.append(table)
    for a in report["attempts"]:
        for b in a["blame"]:
            parts.append(Text(f"attempt {a['attempt']}: blamed {b['node']}: {b['reason']}"))
            parts += [Text(f"    {line}", style="dim") for line in b["evidence"]]
    for r in report.get("in_allocation", []):
        took = sum(r["phases"].values())
        step = r["checkpoint_step"] if r["checkpoint_step"] is not None else "the start"
        parts.append(Text(f"job {r['job_id']}: restart {r['restart']} inside the allocation in {_duration(took)}, "
                          f"from step {step} on {' '.join(r['nodes'])} (no queue wait)"))
        if not r["blame"] and r.get("reason"):
            parts.append(Text(f"    {r['reason']}"))
        for b in r["blame"]:
            given = "given back to Slurm" if b["node"] in r["given_back"] else "kept in the job"
            parts.append(Text(f"    blamed {b['node']} ({given}): {b['reason']}"))
            parts += [Text(f"        {line}", style="dim") for line in b["evidence"]]
    for s in report.get("stragglers", []):
        parts.append(Text(f"job {s['job_id']}: straggler {s['node']} ({s['action']}): {s['ratio']:.2f}x the job's "
                          f"compute time for {s['steps']} steps from step {s['since_step']}, "
                          f"{_duration(s['lost_s'])} lost when found"))
        parts += [Text(f"    {line}", style="dim") for line in (*s["evidence"], *s["hardware"])]
        if s["drain"]:
            parts.append(Text(f"    {s['drain']}", style="dim"))
    share = f"{g['goodput'] * 100:.1f}%" if g["goodput"] is not None else "-"
    parts.append(Text(
        f"goodput {share}: productive {_duration(g['productive_seconds'])} of {_duration(g['wall_seconds'])}; "
        f"lost: redone work {_duration(g['redone_seconds'])}, queue {_duration(g['queue_seconds'])}, "
        f"restart overhead {_duration(g['restart_overhead_seconds'])}, slow nodes {_duration(g['slow_node_seconds'])}; "
        f"node failures {g['node_failures']}"))
    if g["advised_interval_seconds"] is not None:
        parts.append(Text(
            f"checkpoint every {_duration(g['checkpoint_interval_seconds'])} now; Young/Daly advises "
            f"{_duration(g['advised_interval_seconds'])} (cost {_duration(g['checkpoint_cost_seconds'])}, "
            f"MTBF {_duration(g['mtbf_seconds'])})"))
    else:
        parts.append(Text("checkpoint-interval advice needs a measured checkpoint cost and at least one node failure",
                          style="dim"))
    return Group(*parts)
