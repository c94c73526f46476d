"""Playing a second real user in a unit test: `as_user(uid, action)` runs `action` in a forked child that
became `uid` (setgroups, setgid, setuid: the test runs as root), and hands back what it returned or raised."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from typing import Any


def as_user(uid: int, action: Callable[[], Any]) -> Any:
    """Run `action` in a child that became `uid`; ("ok", its result), or ("raised", (exception name, text))."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            outcome: tuple[str, Any] = ("ok", action())
        except BaseException as exc:  # noqa: BLE001 - every outcome goes back to the parent
            outcome = ("raised", (type(exc).__name__, str(exc)))
        os.write(write, pickle.dumps(outcome))
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return pickle.loads(data)
