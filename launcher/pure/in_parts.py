"""Work done in parts: a pure computation that pauses between bounded parts.  (pure)

The in-job agent's loop is single-threaded: while it feeds the hang and straggler watches it takes no
node report.  At 100,000 ranks a whole feed takes a second or more, so each watch offers its feed as a
generator (`Parts`) that does at most PART_RECORDS records' work, yields, and returns the new watch at
the end; the loop takes the reports between two parts.  Nothing is shared between the parts but the
generator's own locals, so the result is the same as the whole computation's (`to_the_end`).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TypeVar

T = TypeVar("T")

Parts = Generator[None, None, T]
"""A computation that yields between its parts and returns its result."""

PART_RECORDS = 4096
"""Records (ranks) handled in one part: a few milliseconds to ~25 ms of the agent's time each."""


def next_part(parts: Parts[T]) -> tuple[bool, T | None]:
    """Do one part of `parts`: (True, its result) when that was the last, else (False, None)."""
    try:
        next(parts)
    except StopIteration as done:
        result: T = done.value
        return True, result
    return False, None


def to_the_end(parts: Parts[T]) -> T:
    """The result of a computation in parts, run without pausing."""
    while True:
        finished, result = next_part(parts)
        if finished:
            return result  # type: ignore[return-value]  # T itself may be Optional: the flag says it is done
