"""The tables of `clusterctl spec`, `plan` and `report` stay readable wherever they are shown.

Piped (not a terminal), each row is one line with every value whole, whatever COLUMNS says, for
`grep` and `less -S`.  On a terminal wide enough, the boxed table; narrower, the same table without
its box; narrower still, each row stacked: its name, its short values labelled, its description on
its own indented lines.  In no layout is a word cut, and every description appears whole.

What each command prints at 60, 80 and 120 columns and piped is pinned in tests/data/golden/tables/
(UPDATE_GOLDEN=1 rewrites them when a change is intended).  A terminal is what rich takes for one
(`TTY_COMPATIBLE=1`) `COLUMNS` wide; styles (bold, italic) are removed before comparing.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from io import StringIO
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from clusterctl.launcher.login.cli import cli
from clusterctl.launcher.pure.spec import reference_rows
from clusterctl.table_view import Column, TextTable
from clusterctl.terminal_view import show
from tests.conftest import REPO
from tests.golden import assert_golden
from tests.unit.test_view_models import SHOWN_ROOT, a_run_with_every_kind_of_event

WIDTHS = (60, 80, 120)
PLAN = ["plan", "--tp", "4", "--pp", "4", "--topology", str(REPO / "tests" / "data" / "slurm" / "fragmented-topology.conf"),
        "--nodelist", "gpu[002-004,009,011-014,018,020-021,025-029]", "--nodes", "16"]
STYLE = re.compile(r"\x1b\[[0-9;]*m")
BOX = re.compile("[\u2500-\u257f]")  # box drawing: the table's borders


def printed(argv: list[str], width: int | None) -> str:
    """What the command prints on a terminal `width` columns wide, or piped (None; COLUMNS says 60)."""
    env = {"TTY_COMPATIBLE": "1" if width else "0", "COLUMNS": str(width or 60), "FORCE_COLOR": None,
           "NO_COLOR": None}
    result = CliRunner().invoke(cli, argv, env=env)
    assert result.exit_code == 0, result.output
    return STYLE.sub("", result.stdout)


def words(text: str) -> list[str]:
    return BOX.sub(" ", text).split()


def cut_words(output: str, *sources: str) -> set[str]:
    """Words shown that are in no source: a word cut in two, or cut short with an ellipsis."""
    return set(words(output)) - {word for source in sources for word in words(source)}


def flowing(text: str) -> str:
    """`text` as one run of words: a value wrapped over lines reads the same as on one line."""
    return " ".join(words(text))


def boxed_rows(output: str) -> list[list[str]]:
    """The cells of a boxed table as shown: each column's pieces over a row's lines, joined."""
    rows: list[list[str]] = []
    for line in output.splitlines():
        if not line.startswith("│"):
            continue
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if cells[0] or not rows:
            rows.append(cells)
        else:
            rows[-1] = [f"{had} {more}".strip() for had, more in zip(rows[-1], cells)]
    return rows


# spec

def test_spec_piped_is_one_row_a_line_with_every_value_whole_whatever_the_columns():
    output = printed(["spec"], None)

    assert_golden("tables/spec-piped.txt", output)
    lines = output.splitlines()
    assert lines[1].split() == ["key", "type", "default", "meaning"]
    for line, (key, kind, default, meaning) in zip(lines[2:], reference_rows(), strict=True):
        assert line.startswith(f"{key} ") and line.endswith(f"  {meaning}")
        assert line.split(maxsplit=1)[1].startswith(f"{kind} ") and f"  {default}  " in line
    assert max(len(line) for line in lines) > 300  # the longest description, on its key's line


@pytest.mark.parametrize("width", WIDTHS)
def test_spec_on_a_terminal_cuts_no_word_and_shows_every_description_whole(width):
    output = printed(["spec"], width)

    assert_golden(f"tables/spec-{width}.txt", output)
    rows = reference_rows()
    assert not cut_words(output, printed(["spec"], None), "type: default:")
    assert all(len(line) <= width for line in output.splitlines())
    if width == 120:  # room for the table, each description at least 36 wide
        assert [[" ".join(cell.split()) for cell in row] for row in boxed_rows(output)] == \
               [[" ".join(cell.split()) for cell in row] for row in rows]
    else:  # stacked: the key, then what it is, then its description on its own lines
        assert "┃" not in output and "│" not in output
        for key, _kind, _default, meaning in rows:
            assert re.search(rf"^{re.escape(key)}\b", output, re.MULTILINE), key
            assert flowing(meaning) in flowing(output), key


def test_spec_stacked_keeps_a_row_on_one_line_when_every_row_fits_and_labels_each_value_otherwise():
    wide_enough = printed(["spec"], 80).splitlines()
    narrow = printed(["spec"], 60).splitlines()

    assert "job.gpus_per_node  type: int  default: 8" in wide_enough
    assert "    GPUs used on each node; one rank per GPU." in wide_enough
    at = narrow.index("job.gpus_per_node")
    assert narrow[at + 1:at + 4] == ["    type:    int", "    default: 8", "    GPUs used on each node; one rank per GPU."]


# plan

def _cost_cells() -> list[str]:
    plan = json.loads(printed([*PLAN, "--json"], None))
    cells = []
    for groups in (plan["cost"]["groups"], *(b["groups"] for b in plan["baselines"].values())):
        for levels in groups.values():
            for c in levels.values():
                cells.append(f"{c['spanning']}/{c['groups']} · {c['span_excess']} · {c['max_span']} · "
                             f"{c['crossing_edges']}")
    return cells


@pytest.mark.parametrize("width", [*WIDTHS, None])
def test_plan_shows_each_cost_whole_on_one_line(width):
    output = printed(PLAN, width)

    assert_golden(f"tables/plan-{width or 'piped'}.txt", output)
    lines = output.splitlines()
    for cell in _cost_cells():
        assert any(cell in line for line in lines), cell
    assert not cut_words(output, printed(PLAN, None), "plan: slurm: dfs:")
    if width is not None:
        assert all(len(line) <= width for line in lines)
    headers = any(line.split()[:2] == ["kind", "level"] for line in lines)
    if width == 120:  # the boxed table
        assert "┃ kind ┃ level" in output
    elif width == 60:  # stacked: each kind and level, then its costs, one a line
        assert "┃" not in output and not headers and "TP  nvlink" in lines
    else:  # 80, the table without its box; piped, one row a line
        assert "┃" not in output and headers


# report

@pytest.fixture
def a_run() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="cg", dir="/tmp"))
    assert len(str(root)) == len(SHOWN_ROOT)  # the golden files show it as /tmp/cg________: same width
    try:
        yield a_run_with_every_kind_of_event(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("width", [*WIDTHS, None])
def test_report_attempts_table_keeps_every_value_whole(a_run, width):
    output = printed(["report", str(a_run)], width).replace(str(a_run.parent), SHOWN_ROOT)

    assert_golden(f"tables/report-{width or 'piped'}.txt", output)
    lines = output.splitlines()
    if width is None:  # nothing wrapped at an assumed width
        assert any(line.startswith("goodput ") and line.endswith("node failures 3") for line in lines)
    else:
        assert all(len(line) <= width for line in lines)
    assert lines[1].split() == ["attempt", "job", "ended", "outcome", "checkpoint", "decision"]
    assert lines[3].split() == ["2", "5", "COMPLETED", "completed", "30", "done"]


def test_report_stacks_its_attempts_on_a_terminal_too_narrow_for_the_table(a_run):
    lines = printed(["report", str(a_run)], 40).splitlines()

    at = lines.index("attempt 2")
    assert lines[at + 1:at + 6] == ["    job:        5", "    ended:      COMPLETED", "    outcome:    completed",
                                    "    checkpoint: 30", "    decision:   done"]


# any table

def on_a_terminal(table: TextTable, width: int) -> str:
    out = StringIO()
    show(Console(file=out, width=width, force_terminal=True, color_system=None), table)
    return out.getvalue()


def piped(table: TextTable) -> str:
    out = StringIO()
    show(Console(file=out, width=40, force_terminal=False, color_system=None), table)
    return out.getvalue()


word = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_./[]:'()", min_size=1, max_size=30)
value = st.lists(word, min_size=1, max_size=3).map(" ".join)
description = st.lists(word, min_size=0, max_size=40).map(" ".join)


@st.composite
def tables(draw: st.DrawFn) -> TextTable:
    count = draw(st.integers(1, 3))
    columns = [Column(f"c{i}", justify=draw(st.sampled_from(["left", "right"])),
                      max_width=draw(st.sampled_from([None, 8]))) for i in range(count)]
    if draw(st.booleans()):
        columns.append(Column("about", prose=True))
    names = st.text("abcdefgh.", min_size=1, max_size=8)
    rows = draw(st.lists(st.tuples(names, *(value if not c.prose else description for c in columns[1:])),
                         min_size=1, max_size=5))
    return TextTable(tuple(columns), tuple(rows), boxed=draw(st.booleans()))


@settings(max_examples=300, deadline=None)
@given(table=tables(), width=st.integers(16, 160))
def test_no_layout_cuts_a_word_or_runs_past_the_line_but_with_a_word_longer_than_it(table, width):
    output = on_a_terminal(table, width)
    sources = [cell for row in table.rows for cell in row] + [f"{c.header} {c.header}:" for c in table.columns]

    assert not cut_words(output, *sources), output
    for line in output.splitlines():
        if len(line) > width:  # only a word longer than the line, whole, after its label
            assert len(line.split()) == 1 or (len(line.split()) == 2 and line.split()[0].endswith(":")), line
    assert Counter(words(output)) >= Counter(word for row in table.rows for cell in row for word in cell.split())


@settings(max_examples=100, deadline=None)
@given(table=tables())
def test_piped_every_row_is_one_line_with_its_values_in_order(table):
    lines = piped(table).splitlines()

    assert len(lines) == 1 + len(table.rows)
    for line, row in zip(lines[1:], table.rows, strict=True):
        assert line.split() == [word for cell in row for word in cell.split()], (line, row)


@pytest.mark.parametrize("width", [None, 200, 50])
def test_outside_text_is_shown_as_written_in_every_layout(width):
    """Boxed (200), stacked (50) or piped: markup is text, controls are visible escapes, and a newline in a
    short value is shown as `\\n` (its row stays a row)."""
    table = TextTable((Column("node", bare=True), Column("reason"), Column("evidence", prose=True)),
                      (("[bold]n1[/bold]", "GPU gone [/dev/nvidia3]\nsecond", ":smile: \x1b[2J owned"),))
    output = piped(table) if width is None else on_a_terminal(table, width)

    for shown in ("[bold]n1[/bold]", "[/dev/nvidia3]\\nsecond", ":smile:", "\\x1b[2J"):
        assert shown in output, output
    assert "\x1b" not in output
