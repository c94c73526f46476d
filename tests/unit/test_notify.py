"""Webhook notifications reach a real HTTP server; a dead endpoint is a log line, not a crash; the URL
(a secret) is never printed whole, redirects are not followed and the caller never waits on a POST."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer
from typing import Any

import requests

from clusterctl.launcher.login.notify import redact, webhook_notifier


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
        notify = webhook_notifier(f"http://127.0.0.1:{server.server_port}/hook/T0KEN", said.append)
        notify("blame", {"run": "/runs/r1", "blame": [{"node": "node3"}]})
        notify("stopped", {"run": "/runs/r1", "message": "boom"})
        assert notify.drain(5.0)
    finally:
        server.shutdown()
    assert received == [{"event": "blame", "text": "clusterctl: run /runs/r1 attempt ? blamed node3", "run": "/runs/r1",
                         "blame": [{"node": "node3"}]},
                        {"event": "stopped", "text": "clusterctl: run /runs/r1 stopped: boom", "run": "/runs/r1",
                         "message": "boom"}]
    assert said[0].startswith(f"warning: webhook http://127.0.0.1:{server.server_port}/… is plain http")
    assert said[1:] == [f"webhook http://127.0.0.1:{server.server_port}/… answered 500 to stopped"]
    dead = webhook_notifier("http://127.0.0.1:9/nothing/S3CRET", said.append, timeout=1)
    dead("done", {})
    dead.drain(5.0)
    assert said[-1] == "webhook http://127.0.0.1:9/… failed for done: ConnectionError"
    assert not any("T0KEN" in line or "S3CRET" in line for line in said)
    webhook_notifier(None, said.append)("done", {})  # no URL: nothing happens


def test_chat_webhooks_get_a_plain_text_line_next_to_the_fields():
    """Slack and Teams incoming webhooks refuse a JSON body without `text` (Slack: 400 no_text): a server that
    answers as Slack does takes every event clusterctl posts, and the structured fields are still there."""
    received: list[dict] = []

    class SlackLike(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append(body)
            ok = isinstance(body.get("text"), str) and body["text"].strip()
            self.send_response(200 if ok else 400)
            self.end_headers()
            self.wfile.write(b"ok" if ok else b"no_text")

    server = HTTPServer(("127.0.0.1", 0), type("Quiet", (SlackLike,), {"log_message": lambda *args: None}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    said: list[str] = []
    try:
        notify = webhook_notifier(f"http://127.0.0.1:{server.server_port}/services/T0/B0/X", said.append)
        notify("blame", {"run": "/runs/r1", "attempt": 2,
                         "blame": [{"node": "node3", "reason": "xid 79 on gpu3", "evidence": ["healthd drain"]}]})
        notify("done", {"run": "/runs/r1", "message": "the run completed"})
        notify("stopped", {"run": "/runs/r1", "message": "no progress\nin 3 attempts"})
        assert notify.drain(5.0)
    finally:
        server.shutdown()
    assert said[1:] == []  # only the plain-http warning: no 400 answered
    assert [body["text"] for body in received] == [
        "clusterctl: run /runs/r1 attempt 2 blamed node3 (xid 79 on gpu3)",
        "clusterctl: run /runs/r1 done: the run completed",
        "clusterctl: run /runs/r1 stopped: no progress in 3 attempts"]
    assert received[0]["blame"][0]["evidence"] == ["healthd drain"] and received[1]["event"] == "done"


def test_the_secret_part_of_a_url_is_never_shown():
    assert redact("https://user:pw@hooks.slack.com/services/T000/B000/XXXX?token=abc") == "https://hooks.slack.com/…"


def test_a_redirect_is_reported_not_followed():
    calls: list[dict[str, Any]] = []

    def post(url: str, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return type("Response", (), {"status_code": 302})()

    said: list[str] = []
    notify = webhook_notifier("https://example.invalid/hook/SECRET", said.append, post=post)
    notify("done", {})
    notify.drain(5.0)
    assert calls[0]["allow_redirects"] is False
    assert said == ["webhook https://example.invalid/… answered 302 to done: redirects are not followed; "
                    "give the final URL"]


def test_a_hanging_endpoint_never_holds_up_the_caller():
    release = threading.Event()

    def post(url: str, **kwargs: Any) -> Any:
        release.wait(30)
        raise requests.Timeout("read timed out for https://example.invalid/hook/SECRET")

    said: list[str] = []
    notify = webhook_notifier("https://example.invalid/hook/SECRET", said.append, post=post)
    caller = threading.Thread(target=lambda: [notify("blame", {}) for _ in range(3)])
    caller.start()
    caller.join(5.0)  # the endpoint answers nothing until released: a caller held up by it is still in there
    assert not caller.is_alive() and not notify.drain(0.1)
    release.set()
    assert notify.drain(5.0)
    assert said == ["webhook https://example.invalid/… failed for blame: Timeout"] * 3


def test_the_run_directory_keeps_the_webhook_from_other_users(tmp_path):
    import stat

    from clusterctl.launcher.shared.runs import create_run
    from clusterctl.launcher.pure.spec import parse_spec
    text = ('[job]\nname = "t"\nnodes = 1\n[launch]\ncommand = ["x"]\n'
            '[restart]\nwebhook = "https://hooks.example.com/T/SECRET"\n')
    run = create_run(tmp_path / "run", parse_spec(text, "job.toml", base_dir=tmp_path), text)
    for name in ("spec.toml", "spec.json"):
        assert stat.S_IMODE((run.path / name).stat().st_mode) == 0o600


def test_a_webhook_that_is_not_an_http_url_is_a_spec_error():
    import pytest

    from clusterctl.errors import SpecError
    from clusterctl.launcher.pure.spec import parse_spec
    with pytest.raises(SpecError, match="an http"):
        parse_spec('[job]\nname = "t"\nnodes = 1\n[launch]\ncommand = ["x"]\n[restart]\nwebhook = "file:///etc/passwd"\n',
                   "job.toml")


def test_a_huge_answer_is_never_read():
    """An endpoint answering 300 MB: the notifier reads its status and closes, promptly and in little memory."""
    body = 300 << 20
    sent: list[int] = []
    finished = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", str(body))
            self.end_headers()
            chunk = b"x" * (1 << 20)
            total = 0
            try:
                while total < body:
                    self.wfile.write(chunk)
                    total += len(chunk)
            except OSError:
                pass  # the notifier hung up: what it could have read is what was sent
            finally:
                sent.append(total)
                finished.set()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    said: list[str] = []
    read: list[int] = []
    real_post = requests.post

    def post(url: str, **kwargs: Any) -> Any:
        response = real_post(url, **kwargs)
        real_read = response.raw.read

        def counted(amt: int | None = None, *args: Any, **kw: Any) -> bytes:
            data = real_read(amt, *args, **kw)
            read.append(len(data))
            return bytes(data)
        response.raw.read = counted
        return response

    try:
        notify = webhook_notifier(f"http://127.0.0.1:{server.server_port}/hook", said.append, post=post)
        notify("done", {"run": "/runs/r1"})
        assert notify.drain(5.0)
        assert finished.wait(10)
    finally:
        server.shutdown()
    assert not [line for line in said if "failed" in line or "answered" in line]
    assert sum(read) == 0, "the answer's body is never read"
    assert sent[0] < body, "the connection was closed long before 300 MB went through it"
