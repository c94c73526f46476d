"""The supervisor's lines on a terminal, never as rich markup (the rules and `plain`, `terminal`:
`clusterctl/terminal_view.py`, shared with healthd's views)."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console
from rich.text import Text

from clusterctl.terminal_view import plain


def said_line(clock_text: str, message: str) -> Text:
    """One line the supervisor says: the time, dimmed, and its message as written."""
    return Text.assemble((clock_text, "dim"), " ", plain(message))


def saying(console: Console, clock_text: Callable[[], str]) -> Callable[[str], None]:
    """The supervisor's `say` on `console`: one timestamped line per message, whatever it holds."""
    def say(message: str) -> None:
        console.print(said_line(clock_text(), message), soft_wrap=True)
    return say

