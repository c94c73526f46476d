"""Text from outside (Slurm's output, node reasons, paths, kernel lines, files other users can write)
made safe to show: every character a terminal or a log reader could act on is written as a visible
escape (`\\x1b`), so what is shown is what was said.  Core: no rich, so the node hooks (run by slurmd
at every job start) and pure judgement use it without paying for rich's import; the views add rich
on top (clusterctl.terminal_view).
"""

from __future__ import annotations

import re

# C0 controls but the newline, DEL and the C1 controls: what a terminal may act on.
_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with each control character (but the newline) written as a visible escape: `\\x1b`, `\\t`."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def one_line(text: str) -> str:
    """`text` as one line: every character that is not printable (the newline, controls, line and
    paragraph separators, bidirectional overrides) written as a visible escape (`\\n`, `\\u202e`)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
