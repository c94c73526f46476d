"""Webhook notifications reach a real HTTP server; a dead endpoint is a log line, not a crash."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from clusterctl.launcher.notify import webhook_notifier


def test_events_are_posted_as_json_and_failures_are_only_reported():
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204 if len(received) == 1 else 500)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    said: list[str] = []
    try:
        notify = webhook_notifier(f"http://127.0.0.1:{server.server_port}/hook", said.append)
        notify("blame", {"run": "/runs/r1", "blame": [{"node": "node3"}]})
        notify("stopped", {"run": "/runs/r1", "message": "boom"})
    finally:
        server.shutdown()
    assert received == [{"event": "blame", "run": "/runs/r1", "blame": [{"node": "node3"}]},
                        {"event": "stopped", "run": "/runs/r1", "message": "boom"}]
    assert said == [f"webhook http://127.0.0.1:{server.server_port}/hook answered 500 to stopped"]
    webhook_notifier("http://127.0.0.1:9/nothing", said.append, timeout=1)("done", {})
    assert said[-1].startswith("webhook http://127.0.0.1:9/nothing failed for done:")
    webhook_notifier(None, said.append)("done", {})  # no URL: nothing happens
