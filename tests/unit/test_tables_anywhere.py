"""The tables of `clusterctl spec`, `plan`, `report` and `status`, and healthd's (`status`, `policy`,
`breaker`), stay readable wherever they are shown.

Piped (not a terminal), each row is one line with every value whole, whatever COLUMNS says, for
`grep` and `less -S`.  On a terminal wide enough, the boxed table; narrower, the same table without
its box; narrower still, each row stacked: its name, its short values labelled, its description on
its own indented lines.  In no layout is a word cut, and every description appears whole.

What spec, plan and report print at 60, 80 and 120 columns and piped is pinned in
tests/data/golden/tables/ (UPDATE_GOLDEN=1 rewrites them when a change is intended).  A terminal is
what rich takes for one (`TTY_COMPATIBLE=1`) `COLUMNS` wide; styles (bold, italic) are removed before
comparing.
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
import time_machine
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

import clusterctl.launcher.login.cli as cli_module
from clusterctl.healthd.breaker_ledger import BreakerLedger
from clusterctl.healthd.cli import cli as healthd_cli
from clusterctl.healthd.findings import Action
from clusterctl.healthd.policy import policy_rows
from clusterctl.launcher.login.cli import cli
from clusterctl.launcher.pure.spec import reference_rows
from clusterctl.table_view import Column, TextTable
from clusterctl.terminal_view import show
from tests.conftest import REPO
from tests.golden import assert_golden
from clusterctl.records.healthd_state import GpuState, HealthdState, StateFinding, write_healthd_state
from clusterctl.slurm.commands import Slurm
from tests.unit.test_view_models import SHOWN_ROOT, a_run_with_every_kind_of_event, recorded_slurm

WIDTHS = (60, 80, 120)
PLAN = ["plan", "--tp", "4", "--pp", "4", "--topology", str(REPO / "tests" / "data" / "slurm" / "fragmented-topology.conf"),
        "--nodelist", "gpu[002-004,009,011-014,018,020-021,025-029]", "--nodes", "16"]
STYLE = re.compile(r"\x1b\[[0-9;]*m")
BOX = re.compile("[\u2500-\u257f]")  # box drawing: the table's borders


def printed(argv: list[str], width: int | None, command=cli, exit_code: int = 0) -> str:
    """What the command prints on a terminal `width` columns wide, or piped (None; COLUMNS says 60)."""
    env = {"TTY_COMPATIBLE": "1" if width else "0", "COLUMNS": str(width or 60), "FORCE_COLOR": None,
           "NO_COLOR": None}
    result = CliRunner().invoke(command, argv, env=env)
    assert result.exit_code == exit_code, result.output
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
    wide_enough = printed(["spec"], 108).splitlines()  # the longest row: checkpoint.validator's seven choices
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
    if width is not None and width < 80:  # the attempts with their nodes do not fit: stacked, each value whole
        at = lines.index("attempt 2")
        assert lines[at + 6:at + 8] == ["    nodes:      node[1-2,4]", "    spares:     node5"]
        return
    assert lines[1].split() == ["attempt", "job", "ended", "outcome", "checkpoint", "decision", "nodes", "spares"]
    assert lines[3].split() == ["2", "5", "COMPLETED", "completed", "30", "done", "node[1-2,4]", "node5"]


def test_report_stacks_its_attempts_on_a_terminal_too_narrow_for_the_table(a_run):
    lines = printed(["report", str(a_run)], 40).splitlines()

    at = lines.index("attempt 2")
    assert lines[at + 1:at + 6] == ["    job:        5", "    ended:      COMPLETED", "    outcome:    completed",
                                    "    checkpoint: 30", "    decision:   done"]


# status

@pytest.fixture
def status_of(a_run, monkeypatch):
    """`clusterctl status` of the run with every kind of event, Slurm answering from recordings."""
    monkeypatch.setattr(cli_module, "Slurm", lambda: Slurm(recorded_slurm))

    def shown(width: int | None) -> str:
        return printed(["status", str(a_run)], width).replace(str(a_run.parent), SHOWN_ROOT)
    return shown


ATTEMPTS = [["attempt", "job", "state", "nodes", "cross-leaf", "(map/Slurm)", "log"],
            ["1", "4", "FAILED", "(NonZeroExitCode)", "exit", "3", "node1", "None", "/", "None",
             f"{SHOWN_ROOT}/llm/logs/4.out"],
            ["2", "5", "CANCELLED", "exit", "0,", "signal", "15", "node1", "0", "/", "2", f"{SHOWN_ROOT}/llm/logs/5.out"]]
STRAGGLER = ("job 5: straggler node4: 1.43x the job's compute time for 40 steps from step 25, 12.5 s lost; excluded; "
             "GPUs: gpu1: clocks throttled (thermal); drained: healthd: straggler")


def test_status_piped_is_one_attempt_a_line_with_every_value_whole(status_of):
    lines = status_of(None).splitlines()  # `clusterctl status RUN | less`, COLUMNS=60

    assert [line.split() for line in lines[2:5]] == ATTEMPTS
    assert STRAGGLER in lines  # a line is a line, whatever its length
    assert "... and 4 more nodes (--json lists them all)" in lines  # the step-time table says what it leaves out


def test_status_at_200_columns_is_the_table_an_attempt_a_line(status_of):
    output = status_of(200)
    lines = output.splitlines()

    assert [line.split() for line in lines[2:5]] == ATTEMPTS
    assert STRAGGLER in lines and all(len(line) <= 200 for line in lines)
    at = lines.index("compute time per step, job 5 at step 60: the job's 0.051 s; lost to slow nodes 12.5 s")
    assert lines[at + 1].split() == ["node", "ranks", "s/step", "x", "job", "state", "lost", "s"]
    assert lines[at + 2].split() == ["node12", "44", "0.0715", "1.43", "straggler", "12.5"]
    assert lines[at + 10] == "... and 4 more nodes (--json lists them all)"


def test_status_at_60_columns_stacks_each_attempt_and_cuts_no_word(status_of):
    output = status_of(60)
    lines = output.splitlines()

    assert all(len(line) <= 60 for line in lines)
    assert not cut_words(output, status_of(None), "job: state: nodes: (map/Slurm): log:")
    at = lines.index("attempt 1")
    assert lines[at + 1:at + 6] == ["    job:                    4",
                                    "    state:                  FAILED (NonZeroExitCode) exit 3",
                                    "    nodes:                  node1",
                                    "    cross-leaf (map/Slurm): None / None",
                                    f"    log:                    {SHOWN_ROOT}/llm/logs/4.out"]
    assert flowing(STRAGGLER) in flowing(output)
    assert "node12  44     0.0715   1.43  straggler    12.5" in lines  # the step-time table fits: a table still
    assert "... and 4 more nodes (--json lists them all)" in lines


# healthd

XID_79 = StateFinding(kind="xid", action=Action.DRAIN_REBOOT, reason="fell off the bus", source="kmsg",
                      at_ts=1795305600.0, xid=79, gpu=3, detail="NVRM: Xid (PCI:0000:5d:00): 79")
ECC = StateFinding(kind="ecc-dbe", action=Action.DRAIN_RESET, reason="r", source="check", at_ts=1795305630.0, gpu=3)
UUIDS = [f"GPU-{i}a3f9c2e-7b1d-4e5f-9a8b-0c1d2e3f4a5{i}" for i in range(4)]


@pytest.fixture
def healthd_config(tmp_path):
    """A node's healthd.toml and state (node gpu-node-0017, GPU 3 with two findings; healthd gone: its last
    word, exit 3), and a breaker ledger with one slot held."""
    write_healthd_state(tmp_path, HealthdState(
        node="gpu-node-0017", pid=999999999, policy_version="3", updated_at=1795305660.0,
        started="2026-11-22T00:00:00Z", nvml_ok=True,
        gpus=tuple(GpuState(i, UUIDS[i], f"0000:{i:02x}:00", (XID_79, ECC) if i == 3 else ()) for i in range(4))))
    (tmp_path / "breaker").mkdir(mode=0o755)
    BreakerLedger(tmp_path / "breaker", "gpu-node-0017", now=lambda: 1795305600.0).claim(
        "gpu", 5, f"healthd: xid 79 gpu3 ({UUIDS[3]}) drain-reboot 2026-11-22T03:00:00Z")
    config = tmp_path / "healthd.toml"
    config.write_text(f'state_dir = "{tmp_path}"\nbreaker_dir = "{tmp_path}/breaker"\npartition = "gpu"\n')
    # The views say how old the state is ("updated 90.0 s ago"): read a minute and a half after it, on any day.
    with time_machine.travel(1795305660.0 + 90, tick=False):
        yield config


GPU_3 = ["3", UUIDS[3], "drain-reboot", "xid", "79", "(drain-reboot)", "2026-11-22T00:00:00Z;", "ecc-dbe",
         "(drain-reset)", "2026-11-22T00:00:30Z"]


def test_healthd_status_piped_is_one_gpu_a_line(healthd_config):
    lines = printed(["status", "--config", str(healthd_config)], None, healthd_cli, exit_code=3).splitlines()

    assert lines[1].startswith("gpu-node-0017: verdict drain-reboot, NVML ok, updated ")
    assert lines[2].split() == ["GPU", "UUID", "verdict", "findings"]
    assert [line.split() for line in lines[3:7]] == [[str(i), UUIDS[i], "healthy", "none"] for i in range(3)] + [GPU_3]


def test_healthd_status_at_200_columns_is_the_boxed_table(healthd_config):
    output = printed(["status", "--config", str(healthd_config)], 200, healthd_cli, exit_code=3)

    assert boxed_rows(output) == [[str(i), UUIDS[i], "healthy", "none"] for i in range(3)] + \
        [[GPU_3[0], GPU_3[1], GPU_3[2], " ".join(GPU_3[3:])]]
    assert all(len(line) <= 200 for line in output.splitlines())


def test_healthd_status_at_60_columns_stacks_each_gpu_with_its_uuid_and_findings_whole(healthd_config):
    output = printed(["status", "--config", str(healthd_config)], 60, healthd_cli, exit_code=3)
    lines = output.splitlines()

    assert all(len(line) <= 60 for line in lines)
    at = lines.index("GPU 3")
    assert lines[at + 1:at + 5] == [f"    UUID:    {UUIDS[3]}", "    verdict: drain-reboot",
                                    "    xid 79 (drain-reboot) 2026-11-22T00:00:00Z; ecc-dbe",
                                    "    (drain-reset) 2026-11-22T00:00:30Z"]
    assert not cut_words(output, printed(["status", "--config", str(healthd_config)], None, healthd_cli, 3),
                         "GPU UUID: verdict:")


@pytest.mark.parametrize("width", [None, 60, 200])
def test_healthd_policy_shows_every_rule_whole(width):
    output = printed(["policy"], width, healthd_cli)
    lines = output.splitlines()

    if width is None:  # a rule a line: `healthd policy | grep xid`
        assert [line.split() for line in lines[2:]] == [" ".join(row).split() for row in policy_rows()]
    else:
        assert all(len(line) <= width for line in lines)
        assert not cut_words(output, printed(["policy"], None, healthd_cli), "action:")
        for signal, action, meaning in policy_rows():
            assert flowing(f"{signal} action: {action} {meaning}") in flowing(output) if width == 60 else \
                [signal, action, meaning] in [[" ".join(c.split()) for c in row] for row in boxed_rows(output)]


@pytest.mark.parametrize("width", [None, 60, 200])
def test_healthd_breaker_shows_each_slots_reason_whole(healthd_config, width):
    output = printed(["breaker", "--config", str(healthd_config)], width, healthd_cli)
    reason = f"healthd: xid 79 gpu3 ({UUIDS[3]}) drain-reboot 2026-11-22T03:00:00Z"

    slot = re.search(r"slot-\d+", output)
    assert slot is not None  # the slot a claim takes is random
    if width is None:
        assert output.splitlines()[2] == f"{slot[0]}  gpu-node-0017  2026-11-22 00:00:00  {reason}"
    else:  # only the title's path, one word, may be longer than a line: whole, for the terminal to fold
        assert all(len(line) <= width or len(line.split()) == 1 for line in output.splitlines())
        shown = f"{slot[0]} node: gpu-node-0017 since (UTC): 2026-11-22 00:00:00" if width == 60 else \
            f"{slot[0]} gpu-node-0017 2026-11-22 00:00:00"
        assert flowing(f"{shown} {reason}") in flowing(output)


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
