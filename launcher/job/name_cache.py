"""Node names to addresses without ever blocking the loop that asks.

The reporter beats every 0.25 s and sends its report from the same loop: a `gethostbyname` there
waits as long as the site's resolver does (seconds, on a DNS server that is slow or gone), and every
beat and report of that node waits with it, so its neighbours would call it silent.  A `NameCache`
answers at once from what it knows; a name it does not know yet is looked up on a thread of its own,
one lookup per name at a time, again no sooner than `retry_seconds` after a failure.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Callable


class NameCache:
    """`address(name)`: the name's IPv4 address if known, else None (and a lookup started off the loop)."""

    def __init__(self, resolve: Callable[[str], str] = socket.gethostbyname, retry_seconds: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.resolve, self.retry_seconds, self.clock = resolve, retry_seconds, clock
        self._known: dict[str, str] = {}
        self._failed_at: dict[str, float] = {}
        self._pending: set[str] = set()
        self._lock = threading.Lock()

    def address(self, name: str) -> str | None:
        """The address of `name` now, or None while it is being looked up or after it failed to resolve."""
        if _is_ipv4(name):
            return name  # nothing to look up
        with self._lock:
            known = self._known.get(name)
            if known is not None or name in self._pending:
                return known
            failed = self._failed_at.get(name)
            if failed is not None and self.clock() - failed < self.retry_seconds:
                return None
            self._pending.add(name)
        threading.Thread(target=self._look_up, args=(name,), name=f"resolve {name}", daemon=True).start()
        return None

    def forget(self, name: str) -> None:
        """Look `name` up again on the next ask (its address stopped working)."""
        with self._lock:
            self._known.pop(name, None)

    def unresolved(self) -> set[str]:
        """The names whose last lookup failed."""
        with self._lock:
            return {name for name in self._failed_at if name not in self._known}

    def _look_up(self, name: str) -> None:
        try:
            found: str | None = self.resolve(name)
        except (OSError, UnicodeError):
            found = None
        with self._lock:
            self._pending.discard(name)
            if found is None:
                self._failed_at[name] = self.clock()
            else:
                self._known[name] = found
                self._failed_at.pop(name, None)


def _is_ipv4(name: str) -> bool:
    try:
        ipaddress.IPv4Address(name)
    except ValueError:
        return False
    return True
