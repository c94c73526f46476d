"""Text from outside (Slurm's node reasons and states, node names, paths, journal messages, healthd's
findings) made safe to show on a terminal.

What a terminal shows must be what was said: a control character (an escape sequence, a carriage
return, a bell) would let whoever wrote the text repaint or retitle the reader's terminal, so each
one is shown as a visible escape (`\\x1b`).  Everything else is kept as it is.  The views then give
the result to rich as a `Text` (never as a str, which rich reads as markup: `[maint]` vanishes and
`[/dev/nvidia3]` raises); see `launcher/login/text_view.py` and `healthd/cli.py`.
"""

from __future__ import annotations

import re

# C0 controls but the newline, DEL and the C1 controls: what a terminal may act on.
_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with each control character (but the newline) written as a visible escape: `\\x1b`, `\\t`."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)
