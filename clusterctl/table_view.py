"""Tables that stay readable wherever they are shown: a wide terminal, a narrow one, a pipe or a file.

One table, three layouts, picked when it is printed (the rules of kubectl, gh and systemctl):

- **piped** (not a terminal): one row per line, columns aligned, every value whole, nothing wrapped
  or cut at an assumed width: `grep` finds a row with its key, `less -S` and `cut` see whole values.
- **table** (a terminal wide enough): the boxed table, or the same without its box where only that
  fits; each column at least as wide as its longest word and a description column at least
  `PROSE_MIN` wide, so no word is ever split.
- **stacked** (a terminal too narrow for either): each row as its name, its short values labelled
  (`type: str  default: 8`, or one a line when a row's do not fit on one), and its description on
  its own indented lines, wrapped between words.

A word longer than the whole line is kept whole (the terminal folds it), never cut.  Cells are text
from wherever (Slurm, the journal, the spec's reference) and are shown as written: control
characters as visible escapes (`clusterctl.terminal_view.plain`), never as rich markup; a newline
in a cell that must stay on one line is shown as `\\n`.  Print with `clusterctl.terminal_view.show`
so the lines around a table follow the same rules.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

from clusterctl.terminal_view import plain, printable

__all__ = ["PROSE_MIN", "Column", "TextTable", "piped_lines", "stacked_lines", "table_widths", "wrapped"]

PROSE_MIN = 36
"""The narrowest description column a table keeps: below it each line holds four or five words, a
column of fragments, and the stacked layout reads better."""
INDENT = "    "
_TOKEN = re.compile(r"\S+|\s+")


@dataclass(frozen=True)
class Column:
    """One column: its header, how its values align, and how they may wrap."""

    header: str
    justify: Literal["left", "right"] = "left"
    max_width: int | None = None
    """Wrap values wider than this between words when the line is short of room (a longer word widens
    the column: none is cut); with room to spare, after the descriptions', values stay on one line."""
    prose: bool = False
    """A description: takes the room the other columns leave; stacked, on its own indented lines."""
    bare: bool = False
    """Stacked, a name shown without its header (a key that speaks for itself: `job.nodes`, not `key job.nodes`)."""


@dataclass(frozen=True)
class TextTable:
    """Rows of text under `columns`, laid out when printed for where they are shown (see the module).

    The first `names` columns name a row: its heading when stacked."""

    columns: tuple[Column, ...]
    rows: tuple[tuple[str, ...], ...]
    title: str = ""
    boxed: bool = True
    names: int = 1

    def __post_init__(self) -> None:
        if any(len(row) != len(self.columns) for row in self.rows):
            raise ValueError(f"every row needs {len(self.columns)} cells")
        if not 1 <= self.names <= len(self.columns):
            raise ValueError(f"names must be 1 to {len(self.columns)}")

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not options.is_terminal:
            yield from (Text(line) for line in piped_lines(self))
            return
        for shape in (self, replace(self, boxed=False)) if self.boxed else (self,):
            widths = table_widths(shape, options.max_width)
            if widths is not None:
                yield shape._rich_table(widths)
                return
        for line, bold in stacked_lines(self, options.max_width):
            text = Text(line, overflow="ignore")  # wrapped already, between words
            text.stylize("bold", 0, bold)
            yield text

    def _rich_table(self, widths: Sequence[int]) -> Table:
        table = Table(title=plain(self.title) if self.title else None, box=box.HEAVY_HEAD if self.boxed else None,
                      pad_edge=self.boxed)
        for column, width in zip(self.columns, widths):
            table.add_column(plain(column.header), justify=column.justify, width=width)
        for row in self.rows:
            table.add_row(*(plain(_cell(value, column)) for value, column in zip(row, self.columns)))
        return table


def _cell(value: str, column: Column) -> str:
    """A cell as shown: printable; a short value on one line (a description keeps its line breaks)."""
    shown = printable(value)
    return shown if column.prose else shown.replace("\n", "\\n")


def _one_line(value: str) -> str:
    return printable(value).replace("\n", "\\n")


def _longest_word(text: str) -> int:
    return max((cell_len(word) for word in text.split()), default=0)


def _longest_line(text: str) -> int:
    return max((cell_len(line) for line in text.split("\n")), default=0)


def _overhead(table: TextTable) -> int:
    """Columns of the screen a table spends on its borders and padding (rich's heavy-head box, or
    two spaces between columns without one)."""
    count = len(table.columns)
    return 3 * count + 1 if table.boxed else 2 * (count - 1)


def table_widths(table: TextTable, width: int) -> tuple[int, ...] | None:
    """The width of each column when `table` is shown as a table `width` columns wide, or None when
    it would not fit without cutting a word or leaving a description less than `PROSE_MIN` wide."""
    naturals: list[int] = []
    widths: list[int] = []
    for index, column in enumerate(table.columns):
        cells = [column.header, *(_cell(row[index], column) for row in table.rows)]
        natural = max(_longest_line(cell) for cell in cells)
        longest_word = max(_longest_word(cell) for cell in cells)
        naturals.append(natural)
        if column.prose:
            widths.append(min(natural, max(PROSE_MIN, longest_word)))
        elif column.max_width is not None:
            widths.append(min(natural, max(column.max_width, longest_word)))
        else:
            widths.append(natural)
    room = width - _overhead(table) - sum(widths)
    if room < 0:
        return None
    # The room left goes to the descriptions, in turn, then to the columns kept narrow by max_width.
    for wanted in (lambda c: c.prose, lambda c: not c.prose and c.max_width is not None):
        for index, column in enumerate(table.columns):
            if wanted(column):
                extra = min(room, naturals[index] - widths[index])
                widths[index] += extra
                room -= extra
    return tuple(max(1, w) for w in widths)


def piped_lines(table: TextTable) -> list[str]:
    """`table` for a pipe or a file: the title, the headers, then one row a line, columns aligned
    (two spaces apart), every value whole and on one line, no trailing spaces."""
    shown = [tuple(_one_line(c.header) for c in table.columns),
             *(tuple(_one_line(value) for value in row) for row in table.rows)]
    widths = [max(cell_len(row[i]) for row in shown) for i in range(len(table.columns))]
    lines = [_one_line(table.title)] if table.title else []
    for row in shown:
        cells = []
        for value, column, width in zip(row, table.columns, widths):
            pad = " " * (width - cell_len(value))
            cells.append(pad + value if column.justify == "right" else value + pad)
        lines.append("  ".join(cells).rstrip())
    return lines


def wrapped(text: str, width: int) -> list[str]:
    """`text` in lines at most `width` wide, broken only between words (a longer word alone on its
    line, whole); spaces inside a line kept as written."""
    lines: list[str] = []
    for paragraph in text.split("\n"):
        line = ""
        for token in _TOKEN.findall(paragraph):
            if token.isspace():
                line += token
            elif not line.strip() or cell_len(line) + cell_len(token) <= width:
                line += token
            else:
                lines.append(line.rstrip())
                line = token
        lines.append(line.rstrip())
    return lines


def stacked_lines(table: TextTable, width: int) -> list[tuple[str, int]]:
    """`table` for a terminal `width` columns wide that is too narrow for it as a table: per row, a
    heading line of its names and labelled short values (`type: str  default: 8`), or, when one
    row's do not fit a line, the names alone and each value on its own indented line; then its
    descriptions indented.  Each line comes with how many of its first characters are the names
    (shown bold)."""
    names = table.columns[:table.names]
    fields = [(i, c) for i, c in enumerate(table.columns) if i >= table.names and not c.prose]
    descriptions = [i for i, c in enumerate(table.columns) if i >= table.names and c.prose]

    def heading(row: tuple[str, ...]) -> str:
        return "  ".join(_one_line(row[i]) if c.bare else f"{_one_line(c.header)} {_one_line(row[i])}"
                         for i, c in enumerate(names))

    def labelled(row: tuple[str, ...]) -> list[str]:
        return [f"{_one_line(c.header)}: {_one_line(row[i])}" for i, c in fields]

    one_line_each = all(cell_len("  ".join([heading(row), *labelled(row)])) <= width for row in table.rows)
    label_width = max((cell_len(_one_line(c.header)) for _, c in fields), default=0) + 2
    lines: list[tuple[str, int]] = []
    if table.title:
        lines += [(line, 0) for line in wrapped(_one_line(table.title), width)]
    for row in table.rows:
        name = heading(row)
        if one_line_each:
            lines.append(("  ".join([name, *labelled(row)]), len(name)))
        else:
            lines.append((name, len(name)))
            for index, column in fields:
                label = f"{_one_line(column.header)}:".ljust(label_width)
                hang = " " * (len(INDENT) + label_width)
                for n, part in enumerate(wrapped(_one_line(row[index]), width - len(hang))):
                    lines.append((f"{INDENT}{label}{part}" if n == 0 else f"{hang}{part}", 0))
        for index in descriptions:
            if not row[index].strip():
                continue
            lines += [(f"{INDENT}{part}".rstrip(), 0)
                      for part in wrapped(printable(row[index]), width - len(INDENT))]
    return lines
