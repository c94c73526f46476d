"""Slurm hostlists: expand `node[01-03,7],gpu-a` to names and compress names back.

Behaviour matches `scontrol show hostnames` / `scontrol show hostlist` of Slurm 22.05
(tested differentially against the real binaries):

* expand: comma (or blank) separated items; each item may hold several bracket groups,
  expanded as a cartesian product in Slurm's order: the last group varies fastest, then
  the first, the second, ... (`a[1-2]b[3-4]c[5-6]` -> a1b3c5 a1b3c6 a2b3c5 ...); zero padding
  takes the width of a range's lower bound (`n[01-3]` -> n01 n02 n03, `n[1-03]` -> n1 n2 n3);
  duplicates and order are kept; text after the last `]` is rejected, as Slurm does; so are
  numbers that are not ASCII digits, ranges of more than 65,536 hosts (Slurm's own limit) and
  numbers longer than 18 digits.  Sizes are counted before anything is built, so an
  expression naming billions of hosts is refused at once instead of filling memory.
  Stricter than Slurm (which expands them silently): control characters (a DEL, an escape)
  and an expression that names no host at all ('', ',') are refused; every place a user
  writes a hostlist means at least one host.
* compress: keeps the order and duplicates of its input; a name joins the previous range
  only when it has the same prefix, the next number and a compatible zero-padding width;
  adjacent ranges with the same prefix share one pair of brackets (`n[1-3,5-6,4]`).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from clusterctl.errors import HostlistError

MAX_HOSTS = 1_000_000  # one expression may not name more hosts than this
MAX_RANGE = 65_536  # Slurm refuses a single range of more hosts ("Too many hosts in range")
MAX_DIGITS = 18  # longer numbers are not host numbers (Slurm saturates them at 2**64-1)
_NUMBER = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() also accepts '٣' and '²'


def expand(expression: str) -> list[str]:
    """All host names of a hostlist expression, in Slurm's order (HostlistError when it names none)."""
    bad = next((c for c in expression if _is_control(c)), None)
    if bad is not None:
        raise HostlistError(f"hostlist {expression!r}: control character {bad!r} at position "
                            f"{expression.index(bad) + 1}; host names are letters, digits, '.', '_' and '-'")
    items = [(item, _item_groups(item, expression)) for item in _split_top_level(expression)]
    total = 0
    for _, (_, groups) in items:
        size = 1
        for options in groups:
            size *= len(options)
            if size > MAX_HOSTS:
                break
        total += size
        if total > MAX_HOSTS:
            raise HostlistError(f"hostlist {expression!r} names more than {MAX_HOSTS:,} hosts")
    if not items:
        raise HostlistError(f"hostlist {expression!r} names no host; give at least one, e.g. 'node[1-4]'")
    names: list[str] = []
    for _, (texts, groups) in items:
        names.extend(_product(texts, groups))
    return names


def _is_control(char: str) -> bool:
    """ASCII control characters (DEL too) other than the blanks that separate items."""
    return (ord(char) < 32 and char not in "\t\n") or char == "\x7f"


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


def _item_groups(item: str, expression: str) -> tuple[list[str], list[list[str]]]:
    """An item's literal texts (one more than its groups) and each bracket group's numbers."""
    texts: list[str] = []
    groups: list[list[str]] = []
    pos = 0
    for match in _GROUP.finditer(item):
        texts.append(item[pos:match.start()])
        groups.append(_expand_ranges(match.group(1), expression))
        pos = match.end()
    if pos and pos < len(item):
        # Slurm 22.05 rejects a suffix after the last bracket group ("x[1-3]y").
        raise HostlistError(f"hostlist {expression!r}: text {item[pos:]!r} after ']' is not allowed")
    texts.append(item[pos:] if not pos else "")
    return texts, groups


def _product(texts: list[str], groups: list[list[str]]) -> Iterator[str]:
    # Slurm's order (measured with `scontrol show hostnames`): the last group varies fastest,
    # then the first, the second, ...; the one before the last varies slowest.
    if not groups:
        yield texts[0]
        return
    order = [*reversed(range(len(groups) - 1)), len(groups) - 1]  # slowest first
    for choice in itertools.product(*(groups[i] for i in order)):
        picked = dict(zip(order, choice, strict=True))
        yield "".join(text + picked[i] for i, text in enumerate(texts[:-1])) + texts[-1]


def _expand_ranges(ranges: str, expression: str) -> list[str]:
    out: list[str] = []
    for part in ranges.split(","):
        lo_text, sep, hi_text = part.partition("-")
        if not _NUMBER.fullmatch(lo_text) or (sep and not _NUMBER.fullmatch(hi_text)):
            raise HostlistError(f"hostlist {expression!r}: invalid range {part!r} (expected N or N-M, "
                                "ASCII digits)")
        if len(lo_text) > MAX_DIGITS or len(hi_text) > MAX_DIGITS:
            raise HostlistError(f"hostlist {expression!r}: number in {part!r} is longer than {MAX_DIGITS} digits")
        lo, hi = int(lo_text), int(hi_text) if sep else int(lo_text)
        if hi < lo:
            raise HostlistError(f"hostlist {expression!r}: invalid range {part!r} (end before start)")
        if hi - lo + 1 > MAX_RANGE:
            raise HostlistError(f"hostlist {expression!r}: range {part!r} is too large (more than "
                                f"{MAX_RANGE:,} hosts, Slurm's limit for one range)")
        if len(out) + hi - lo + 1 > MAX_HOSTS:
            raise HostlistError(f"hostlist {expression!r} names more than {MAX_HOSTS:,} hosts")
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
    if not digits or len(digits) > MAX_DIGITS:
        return _Range(name, 0, 0, 0, False)
    number = int(digits)
    return _Range(stem, number, number, len(digits), True)


def compress(names: Iterable[str]) -> str:
    """A hostlist expression for `names`, in their order, as `scontrol show hostlist` prints it."""
    ranges: list[_Range] = []
    for name in names:
        if not name or any(c in ",[] \t\n" or _is_control(c) for c in name):
            raise HostlistError(f"{name!r} is not a host name (no commas, brackets, blanks or control characters)")
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
