"""Slurm hostlists: expand `node[01-03,7],gpu-a` to names and compress names back.

Behaviour matches `scontrol show hostnames` / `scontrol show hostlist` of Slurm 22.05
(tested differentially against the real binaries):

* expand: comma (or blank) separated items; each item may hold several bracket groups,
  expanded as a cartesian product with the last group varying fastest; zero padding
  takes the width of a range's lower bound (`n[01-3]` -> n01 n02 n03, `n[1-03]` -> n1 n2 n3);
  duplicates and order are kept; text after the last `]` is rejected, as Slurm does.
* compress: keeps the order and duplicates of its input; a name joins the previous range
  only when it has the same prefix, the next number and a compatible zero-padding width;
  adjacent ranges with the same prefix share one pair of brackets (`n[1-3,5-6,4]`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from clusterctl.errors import HostlistError

MAX_HOSTS = 1_000_000  # one expression may not name more hosts than this


def expand(expression: str) -> list[str]:
    """All host names of a hostlist expression, in Slurm's order."""
    names: list[str] = []
    for item in _split_top_level(expression):
        names.extend(_expand_item(item, expression))
        if len(names) > MAX_HOSTS:
            raise HostlistError(f"hostlist {expression!r} names more than {MAX_HOSTS:,} hosts")
    return names


def _split_top_level(expression: str) -> Iterator[str]:
    depth, start = 0, 0
    for i, char in enumerate(expression):
        if char == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"hostlist {expression!r}: nested '[' at position {i + 1}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"hostlist {expression!r}: ']' without '[' at position {i + 1}")
        elif char in ", \t\n" and depth == 0:
            if i > start:
                yield expression[start:i]
            start = i + 1
    if depth != 0:
        raise HostlistError(f"hostlist {expression!r}: '[' is never closed")
    if len(expression) > start:
        yield expression[start:]


_GROUP = re.compile(r"\[([^\[\]]*)\]")


def _expand_item(item: str, expression: str) -> list[str]:
    pieces: list[list[str]] = []
    pos = 0
    for match in _GROUP.finditer(item):
        pieces.append([item[pos:match.start()]])
        pieces.append(_expand_ranges(match.group(1), expression))
        pos = match.end()
    if pos and pos < len(item):
        # Slurm 22.05 rejects a suffix after the last bracket group ("x[1-3]y").
        raise HostlistError(f"hostlist {expression!r}: text {item[pos:]!r} after ']' is not allowed")
    if not pos:
        return [item]
    names = [""]
    for options in pieces:
        names = [name + option for name in names for option in options]
        if len(names) > MAX_HOSTS:
            raise HostlistError(f"hostlist {expression!r} names more than {MAX_HOSTS:,} hosts")
    return names


def _expand_ranges(ranges: str, expression: str) -> list[str]:
    out: list[str] = []
    for part in ranges.split(","):
        lo_text, sep, hi_text = part.partition("-")
        if not lo_text.isdigit() or (sep and not hi_text.isdigit()):
            raise HostlistError(f"hostlist {expression!r}: invalid range {part!r} (expected N or N-M)")
        lo, hi = int(lo_text), int(hi_text) if sep else int(lo_text)
        if hi < lo:
            raise HostlistError(f"hostlist {expression!r}: invalid range {part!r} (end before start)")
        if hi - lo + 1 > MAX_HOSTS:
            raise HostlistError(f"hostlist {expression!r}: range {part!r} is too large")
        width = len(lo_text)
        out.extend(f"{n:0{width}d}" for n in range(lo, hi + 1))
    return out


@dataclass
class _Range:
    prefix: str
    lo: int
    hi: int
    width: int
    numbered: bool

    def text(self) -> str:
        lo = f"{self.lo:0{self.width}d}"
        return lo if self.lo == self.hi else f"{lo}-{self.hi:0{self.width}d}"


def _digits(n: int) -> int:
    return len(str(n))


def _padding(number: int, width: int) -> int:
    return max(width - _digits(number), 0)


def _width_compatible(tail: _Range, host: _Range) -> int | None:
    """The width both can share, or None (Slurm's zero-padding equivalence)."""
    if tail.width == host.width:
        return tail.width
    tail_own, tail_other = _padding(tail.lo, tail.width), _padding(tail.lo, host.width)
    host_own, host_other = _padding(host.lo, host.width), _padding(host.lo, tail.width)
    if tail_own != tail_other and host_own != host_other:
        return None
    return tail.width if tail_own != tail_other else host.width


def _parse_name(name: str) -> _Range:
    stem = name.rstrip("0123456789")
    digits = name[len(stem):]
    if not digits:
        return _Range(name, 0, 0, 0, False)
    number = int(digits)
    return _Range(stem, number, number, len(digits), True)


def compress(names: Iterable[str]) -> str:
    """A hostlist expression for `names`, in their order, as `scontrol show hostlist` prints it."""
    ranges: list[_Range] = []
    for name in names:
        if not name or any(c in name for c in ",[] \t\n"):
            raise HostlistError(f"{name!r} is not a host name (no commas, brackets or blanks)")
        host = _parse_name(name)
        tail = ranges[-1] if ranges else None
        if tail and tail.numbered and host.numbered and tail.prefix == host.prefix and tail.hi + 1 == host.lo:
            width = _width_compatible(tail, host)
            if width is not None:
                tail.width, tail.hi = width, host.hi
                continue
        ranges.append(host)
    return ",".join(_render_groups(ranges))


def _render_groups(ranges: list[_Range]) -> Iterator[str]:
    i = 0
    while i < len(ranges):
        first = ranges[i]
        if not first.numbered:
            yield first.prefix
            i += 1
            continue
        j = i + 1
        while j < len(ranges) and ranges[j].numbered and ranges[j].prefix == first.prefix:
            j += 1
        group = ranges[i:j]
        if len(group) == 1 and first.lo == first.hi:
            yield first.prefix + first.text()
        else:
            yield f"{first.prefix}[{','.join(r.text() for r in group)}]"
        i = j
