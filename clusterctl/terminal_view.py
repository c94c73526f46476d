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

from rich.console import Console, RenderableType
from rich.segment import Segments
from rich.text import Text

from clusterctl.text import printable

__all__ = ["plain", "plain_row", "printable", "show", "terminal"]

UNBOUNDED = 1_000_000
"""The width a view is laid out at when it is not shown on a terminal: no line is that long."""


def plain(text: object, style: str = "") -> Text:
    """`text` (str() of it) as rich Text, shown as written; control characters as visible escapes."""
    return Text(printable(str(text)), style=style)


def plain_row(*cells: object) -> list[Text]:
    """A table row of `plain` cells (a str cell would be read as markup)."""
    return [plain(cell) for cell in cells]


def terminal(*, stderr: bool = False) -> Console:
    """A console that reads no markup, emoji codes or highlighting in a str."""
    return Console(stderr=stderr, markup=False, emoji=False, highlight=False)


def show(console: Console, renderable: RenderableType) -> None:
    """Print a view.  On a terminal, lines wrap between words at its width (a line laid out already,
    as a `TextTable`'s, is not cropped: a word longer than the line stays whole and the terminal
    folds it); elsewhere (a pipe, a file) nothing wraps: every line is whole, for `grep`, `less -S`
    or whoever reads it to wrap as they like."""
    if console.is_terminal:
        console.print(renderable, crop=False)
        return
    # As wide as it is: rich would wrap at COLUMNS or an assumed 80, and crop a tree's labels there.
    unbounded = console.options.update(width=UNBOUNDED, no_wrap=True, overflow="ignore")
    console.print(Segments(console.render(renderable, unbounded)), soft_wrap=True)
