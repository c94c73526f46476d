"""What `clusterctl status` shows: a run's attempts joined with what Slurm says (pure)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from rich.console import Group
from rich.table import Table
from rich.text import Text

from clusterctl.launcher.restart_policy import END_EVENTS
from clusterctl.launcher.runs import RunDir
from clusterctl.slurm.jobs import JobReport



def _rank_map_summary(job_dir: Path) -> dict | None:
    try:
        document = json.loads((job_dir / "rankmap.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    plan = document.get("plan", {})
    return {"slots": document.get("slots"), "strategy": plan.get("strategy"),
            "leaf_crossing_groups": plan.get("cost", {}).get("leaf_crossing_dp_pp_groups"),
            "slurm_order_leaf_crossing_groups": plan.get("baselines", {}).get("slurm", {}).get(
                "leaf_crossing_dp_pp_groups"),
            "dfs_order_leaf_crossing_groups": plan.get("baselines", {}).get("dfs", {}).get(
                "leaf_crossing_dp_pp_groups")}


def best_report(job_id: str, queue: Mapping[str, JobReport], accounting: Mapping[str, JobReport]) -> JobReport | None:
    """The controller's view while it has the job (fresher), else accounting's."""
    return queue.get(job_id) or accounting.get(job_id)


def run_status(run: RunDir, queue: Mapping[str, JobReport], accounting: Mapping[str, JobReport]) -> dict:
    """A JSON-ready status of the run."""
    events = run.events()
    attempts = []
    for attempt in run.attempts():
        report = best_report(attempt.job_id, queue, accounting)
        attempts.append({
            "attempt": attempt.number, "job_id": attempt.job_id,
            "state": report.state if report else "UNKNOWN", "reason": report.reason if report else "",
            "nodes": report.nodes if report else "", "exit_code": report.exit_code if report else None,
            "resume_from": attempt.resume_from, "exclude": attempt.exclude,
            "log": str(run.log_path(attempt.job_id)), "rank_map": _rank_map_summary(run.job_dir(attempt.job_id)),
        })
    ended = [e for e in events if e["event"] in END_EVENTS]
    if ended:
        state = ended[-1]["event"]
    elif attempts:
        state = attempts[-1]["state"]
    else:
        state = "not submitted"
    created = next((e for e in events if e["event"] == "created"), {})
    return {"run": str(run.path), "name": created.get("name", run.path.name), "state": state,
            "message": ended[-1].get("message", "") if ended else "", "attempts": attempts}


def status_renderables(status: dict) -> Group:
    """The status for a terminal."""
    title = Text.assemble((status["name"], "bold"), f"  {status['state']}", f"  {status['run']}")
    parts: list = [title]
    if status.get("message"):
        parts.append(Text(status["message"]))
    table = Table(box=None, pad_edge=False)
    for column in ("attempt", "job", "state", "nodes", "cross-leaf groups (map / Slurm order)"):
        table.add_column(column)
    table.add_column("log", overflow="fold")
    for a in status["attempts"]:
        rm = a["rank_map"]
        cost = (f"{rm['leaf_crossing_groups']} / {rm['slurm_order_leaf_crossing_groups']}" if rm else "-")
        state = a["state"] + (f" ({a['reason']})" if a["reason"] not in ("", "None") else "")
        table.add_row(str(a["attempt"]), a["job_id"], state, a["nodes"] or "-", cost, a["log"])
    parts.append(table)
    return Group(*parts)


def find_run_of_job(runs_root: Path, job_id: str) -> RunDir | None:
    """The newest run under `runs_root` that submitted `job_id` (ids restart on a fresh cluster)."""
    found: list[tuple[float, RunDir]] = []
    for journal in runs_root.glob("*/journal.jsonl"):
        run = RunDir(journal.parent)
        for attempt in run.attempts():
            if attempt.job_id == job_id:
                found.append((attempt.submitted_at, run))
    return max(found, key=lambda item: item[0])[1] if found else None


def list_runs(runs_root: Path, limit: int = 20) -> list[RunDir]:
    """The newest runs under `runs_root`."""
    runs = [RunDir(p.parent) for p in runs_root.glob("*/spec.json")]
    runs.sort(key=lambda r: r.journal_path.stat().st_mtime if r.journal_path.exists() else 0, reverse=True)
    return runs[:limit]
