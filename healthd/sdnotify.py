"""systemd's notify protocol (Type=notify, WatchdogSec=): one datagram to $NOTIFY_SOCKET."""

from __future__ import annotations

import os
import socket


def notify(message: str) -> bool:
    """Send e.g. "READY=1" or "WATCHDOG=1"; False when not run by systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract socket namespace
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(message.encode(), address)
        except OSError:
            return False
    return True
