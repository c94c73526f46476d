"""Optional webhook notifications (a JSON POST per event); a failed POST is logged, never fatal.

The URL is often a secret (Slack and Teams hooks carry their token in the path), so it is
never printed whole: messages name only its scheme and host.  POSTs go out from one
background thread in event order, so the supervisor's decisions never wait on a slow or dead
endpoint; `drain()` waits (boundedly) for the last ones before the process exits.  Redirects
are not followed (a redirect could carry the payload elsewhere), and plain http is warned about.
Only the answer's status line and headers are read, never its body (whatever its size).

Each POST carries a plain `text` line next to the structured fields: Slack's and Teams' incoming
webhooks refuse a payload without one (Slack answers 400 `no_text`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import requests

Post = Callable[..., Any]

TEXT_LIMIT = 1000
"""The `text` line is cut to this many characters (a message or a list of blamed nodes can be long)."""


def summary_text(event: str, payload: dict[str, Any]) -> str:
    """The one-line `text` of an event, for chat webhooks: `clusterctl: run /runs/r1 stopped: boom`,
    `clusterctl: run /runs/r1 attempt 2 blamed node3 (xid 79)`."""
    run = payload.get("run", "?")
    if event == "blame":
        blamed = ", ".join(f"{b.get('node', '?')} ({b.get('reason', '')})" if b.get("reason") else str(b.get("node", "?"))
                           for b in payload.get("blame", []) if isinstance(b, dict))
        line = f"clusterctl: run {run} attempt {payload.get('attempt', '?')} blamed {blamed or 'no node'}"
    else:
        message = payload.get("message")
        line = f"clusterctl: run {run} {event}" + (f": {message}" if message else "")
    line = " ".join(str(line).split())  # one line, whatever a message holds
    return line if len(line) <= TEXT_LIMIT else line[:TEXT_LIMIT - 1] + "…"


def redact(url: str) -> str:
    """The URL with only scheme and host kept: `https://hooks.slack.com/…`."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(an unreadable webhook URL)"
    return f"{parts.scheme or '?'}://{host}{port}/…"


class WebhookNotifier:
    """Call with (event, payload): queued and POSTed by a background thread; `drain()` before exit."""

    def __init__(self, url: str | None, say: Callable[[str], None], timeout: float = 5.0,
                 post: Post = requests.post) -> None:
        self.url, self.say, self.timeout, self.post = url, say, timeout, post
        self.shown = redact(url) if url else ""
        self._queue: queue.Queue[tuple[str, dict[str, Any]] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        if url and urlsplit(url).scheme == "http":
            say(f"warning: webhook {self.shown} is plain http: the events (and the URL's secret) travel "
                "unencrypted; use https")

    def __call__(self, event: str, payload: dict[str, Any]) -> None:
        if not self.url:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="webhook", daemon=True)
            self._thread.start()
        self._queue.put((event, payload))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                self._send(*item)
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def _send(self, event: str, payload: dict[str, Any]) -> None:
        try:
            # stream=True: the answer's body is not read with its headers, and never after: only the
            # status is used.  Read whole, an answer of 300 MB would cost this process twice that, and
            # one dripping a byte at a time would hold the notifier (the timeout is per read).
            response = self.post(self.url, json={"event": event, "text": summary_text(event, payload), **payload}, timeout=self.timeout,
                                 allow_redirects=False, stream=True)
        except requests.RequestException as exc:
            # The exception's text carries the URL: say only what kind of failure it was.
            self.say(f"webhook {self.shown} failed for {event}: {type(exc).__name__}")
            return
        close = getattr(response, "close", None)
        if close is not None:
            close()  # drops the connection, the body unread (each POST has a connection of its own)
        status = int(getattr(response, "status_code", 0))
        if 300 <= status < 400:
            self.say(f"webhook {self.shown} answered {status} to {event}: redirects are not followed; "
                     "give the final URL")
        elif status >= 400:
            self.say(f"webhook {self.shown} answered {status} to {event}")

    def drain(self, timeout: float | None = None) -> bool:
        """Wait up to `timeout` seconds (default: one POST's timeout) for queued events; True when all went."""
        if self._thread is None:
            return True
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks


def webhook_notifier(url: str | None, say: Callable[[str], None], timeout: float = 5.0,
                     post: Post = requests.post) -> WebhookNotifier:
    """A notifier that POSTs {"event": ..., "text": a summary line, **payload} to `url` in the background (nothing without a URL)."""
    return WebhookNotifier(url, say, timeout, post)
