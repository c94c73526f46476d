"""How `clusterctl status --watch` shows a run (launcher/login/watch.py decides what and when)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group, RenderableType

from clusterctl.clock import utc
from clusterctl.launcher.login.status import RunStatus, status_renderables
from clusterctl.launcher.login.watch import RECENT_EVENTS, slowest_node, status_line
from clusterctl.terminal_view import plain, printable


@dataclass
class LineView:
    """Without a terminal: one line per change, prefixed with the time (`--json`: one object per line)."""

    write: Callable[[str], None]
    as_json: bool = False
    last: str = ""

    def status(self, at: float, status: RunStatus) -> None:
        # The checkpoint's age grows with every look: a line is written when anything else changed.
        text = json.dumps(status.to_json(), sort_keys=True) if self.as_json else status_line(status)
        if text == self.last:
            return
        self.last = text
        if self.as_json:
            self.write(json.dumps(watch_json_record(at, status), sort_keys=True))
        else:
            self.write(f"{utc(at)} {status_line(status, at)}")

    def event(self, at: float, line: str) -> None:
        if self.as_json:
            self.write(json.dumps({"at": at, "event": printable(line)}, sort_keys=True))
        else:
            self.write(f"{utc(at)} {printable(line)}")

    def problem(self, at: float, line: str) -> None:
        if self.as_json:
            self.write(json.dumps({"at": at, "problem": printable(line)}, sort_keys=True))
        else:
            self.write(f"{utc(at)} {printable(line)}")


@dataclass
class LiveView:
    """On a terminal: the status as `clusterctl status` draws it (with the ETA, the newest checkpoint and its
    age, the goodput so far), the slowest node, and the newest events."""

    update: Callable[[RenderableType], None]
    latest: RunStatus | None = None
    recent: list[str] = field(default_factory=list)

    def _draw(self, at: float) -> None:
        parts: list[RenderableType] = []
        if self.latest is not None:
            parts.append(status_renderables(self.latest, at))
            if (slow := slowest_node(self.latest)) is not None:
                parts.append(plain(slow))
        parts += [plain(line) for line in self.recent[-RECENT_EVENTS:]]
        parts.append(plain(f"as of {utc(at)}; Ctrl-C to stop watching (the run goes on)", "dim"))
        self.update(Group(*parts))

    def status(self, at: float, status: RunStatus) -> None:
        self.latest = status
        self._draw(at)

    def event(self, at: float, line: str) -> None:
        self.recent.append(f"{utc(at)} {line}")
        del self.recent[:-RECENT_EVENTS]
        self._draw(at)

    def problem(self, at: float, line: str) -> None:
        self.event(at, line)


def watch_json_record(at: float, status: RunStatus) -> dict[str, Any]:
    """One `--watch --json` line: `status --json`'s object with the time of the look."""
    return {"at": at, **status.to_json()}


