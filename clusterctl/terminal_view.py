"""Text from outside (Slurm's node reasons and states, node names, paths, journal messages, healthd's
findings) made safe to show on a terminal.

What a terminal shows must be what was said: a control character (an escape sequence, a carriage
return, a bell) would let whoever wrote the text repaint or retitle the reader's terminal, so each
one is shown as a visible escape (`\\x1b`).  Everything else is kept as it is.  The views then give
the result to rich as a `Text` (never as a str, which rich reads as markup: `[maint]` vanishes and
`[/dev/nvidia3]` raises MarkupError; `:emoji:` codes are replaced, in `print` and in table cells
alike): each piece of outside text is a `Text` (`plain`), and the console itself reads no markup,
emoji or highlighting (`terminal`), so a str that slips through is still shown as written.  One
definition for every view: clusterctl's (launcher/login) and healthd's.
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from clusterctl.text import printable

__all__ = ["plain", "plain_row", "printable", "terminal"]


def plain(text: object, style: str = "") -> Text:
    """`text` (str() of it) as rich Text, shown as written; control characters as visible escapes."""
    return Text(printable(str(text)), style=style)


def plain_row(*cells: object) -> list[Text]:
    """A table row of `plain` cells (a str cell would be read as markup)."""
    return [plain(cell) for cell in cells]


def terminal(*, stderr: bool = False) -> Console:
    """A console that reads no markup, emoji codes or highlighting in a str."""
    return Console(stderr=stderr, markup=False, emoji=False, highlight=False)
