"""Optional webhook notifications (a JSON POST per event); a failed POST is logged, never fatal."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import requests


def webhook_notifier(url: str | None, say: Callable[[str], None],
                     timeout: float = 5.0) -> Callable[[str, dict[str, Any]], None]:
    """A notifier that POSTs {"event": ..., **payload} to `url` (or does nothing without a URL)."""
    def notify(event: str, payload: dict[str, Any]) -> None:
        if not url:
            return
        try:
            response = requests.post(url, json={"event": event, **payload}, timeout=timeout)
            if response.status_code >= 400:
                say(f"webhook {url} answered {response.status_code} to {event}")
        except requests.RequestException as exc:
            say(f"webhook {url} failed for {event}: {exc}")
    return notify
