"""The one way a value reaches a generated shell script: as a single, inert shell word."""

from __future__ import annotations

import shlex
from collections.abc import Iterable


def quote(value: str) -> str:
    """`value` as one bash word that expands to exactly itself.

    Single quotes stop every expansion bash has ($, backticks, globs, ;, newlines); shlex
    closes and reopens them around embedded single quotes.  NUL cannot be passed to a
    program at all, so it is refused rather than silently cut.
    """
    if "\0" in value:
        raise ValueError("a NUL character cannot be passed through a shell script")
    return shlex.quote(value)


def words(values: Iterable[str]) -> str:
    """Several values as quoted words separated by spaces (for a bash array literal)."""
    return " ".join(quote(v) for v in values)


def comment(text: str) -> str:
    """Text made safe for a `#` comment line: control characters shown escaped, never a new line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
