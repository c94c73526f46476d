"""How `clusterctl` puts text on a terminal: never as rich markup.

Most of what the login commands show comes from outside: Slurm's states and node reasons (an
admin's, slurmd's, a health checker's: `GPU gone [/dev/nvidia3]`), node names, paths, the run
journal's messages.  rich reads a str as markup (`[maint]` vanishes, `[/dev/nvidia3]` raises
MarkupError) and replaces `:emoji:` codes, in `print` and in table cells alike, so nothing reaches
rich as a str: each piece of text is a `Text` (`plain`), and the console itself reads no markup,
emoji or highlighting (`terminal`), so a str that slips through is still shown as written.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console
from rich.text import Text

from clusterctl.terminal_text import printable


def plain(text: object, style: str = "") -> Text:
    """`text` (str() of it) as rich Text, shown as written; control characters as visible escapes."""
    return Text(printable(str(text)), style=style)


def plain_row(*cells: object) -> list[Text]:
    """A table row of `plain` cells (a str cell would be read as markup)."""
    return [plain(cell) for cell in cells]


def terminal(*, stderr: bool = False) -> Console:
    """A console that reads no markup, emoji codes or highlighting in a str."""
    return Console(stderr=stderr, markup=False, emoji=False, highlight=False)


def said_line(clock_text: str, message: str) -> Text:
    """One line the supervisor says: the time, dimmed, and its message as written."""
    return Text.assemble((clock_text, "dim"), " ", plain(message))


def saying(console: Console, clock_text: Callable[[], str]) -> Callable[[str], None]:
    """The supervisor's `say` on `console`: one timestamped line per message, whatever it holds."""
    def say(message: str) -> None:
        console.print(said_line(clock_text(), message), soft_wrap=True)
    return say

