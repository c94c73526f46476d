"""`clusterctl report RUN --html FILE` in a real browser: headless Chromium (Debian's `chromium`
package; scripts/setup.sh installs it) renders the page to a PNG and dumps the DOM it built, and
the test looks at what rendered: the fault's marker where the failed attempt meets the resubmitted
one, the training curves under it with their gap at the fault, the texts a user reads, and nothing
that runs.

The PNG is read with zlib and struct (8-bit RGB or RGBA, not interlaced: what Chromium writes).
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from clusterctl.launcher.login.cli import cli
from clusterctl.launcher.login.report_drawing import (
    COMPLETED_COLOUR, CURVE_COLOUR, ENDED_COLOUR, FAULT_COLOUR, RECOVERY_COLOUR,
)
from clusterctl.launcher.pure.spec import load_spec
from clusterctl.launcher.shared.runs import create_run
from clusterctl.records.run_journal import BlamedNode, Decided, DecisionAction, OutcomeKind, SlurmTimes, Submitted
from tests.conftest import REPO

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium to render the page "
                                "(apt-get install chromium; scripts/setup.sh and scripts/test.sh install it)")
WIDTH, HEIGHT = 1040, 900


@dataclass(frozen=True)
class Rendered:
    """What Chromium made of a page: the DOM it built (serialised) and its screenshot's pixels."""

    dom: str
    width: int
    height: int
    rows: tuple[bytes, ...]
    """Each row's pixels, 3 bytes (RGB) each."""

    def pixels(self, colour: str) -> Iterator[tuple[int, int]]:
        """(x, y) of every pixel of exactly `colour` (`#rrggbb`): Chromium paints a flat fill in the
        colour the page names, so only edges (anti-aliased) differ."""
        want = bytes.fromhex(colour.lstrip("#"))
        for y, row in enumerate(self.rows):
            at = row.find(want)
            while at >= 0:
                if at % 3 == 0:
                    yield at // 3, y
                at = row.find(want, at + 1)


def decode_png(data: bytes) -> tuple[int, int, tuple[bytes, ...]]:
    """Width, height and RGB rows of an 8-bit, non-interlaced RGB or RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, chunks, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
    assert header is not None, "a PNG without its header"
    width, height, depth, colour_type, _, _, interlace = header
    assert depth == 8 and colour_type in (2, 6) and interlace == 0, f"a PNG this reader does not know: {header}"
    bpp = 3 if colour_type == 2 else 4
    raw = zlib.decompress(b"".join(chunks))
    stride = width * bpp
    rows = []
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        if kind == 1:  # Sub
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 255
        elif kind == 2:  # Up
            line = bytearray((a + b) & 255 for a, b in zip(line, previous))
        elif kind == 3:  # Average
            for i in range(stride):
                line[i] = (line[i] + (((line[i - bpp] if i >= bpp else 0) + previous[i]) >> 1)) & 255
        elif kind == 4:  # Paeth
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = previous[i], previous[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line) if bpp == 3 else bytes(v for i, v in enumerate(line) if i % 4 != 3))
        previous = line
    return width, height, tuple(rows)


def render(page: Path, tmp_path: Path) -> Rendered:
    """Chromium's screenshot of `page` (WIDTH x HEIGHT) and the DOM it built, from one headless run."""
    shot = tmp_path / "shot.png"
    argv = [str(CHROMIUM), "--headless=new", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            "--force-device-scale-factor=1", f"--user-data-dir={tmp_path / 'profile'}",
            f"--window-size={WIDTH},{HEIGHT}", f"--screenshot={shot}", "--dump-dom", page.as_uri()]
    if os.geteuid() == 0:
        # Chromium will not start its sandbox as root (CI runs the suite as root).  What it renders here
        # is the test's own page, which runs no script and fetches nothing (its CSP forbids both).
        argv.insert(1, "--no-sandbox")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and shot.exists(), f"chromium failed (exit {done.returncode}): {done.stderr[-2000:]}"
    width, height, rows = decode_png(shot.read_bytes())
    return Rendered(done.stdout, width, height, rows)


class Dom(HTMLParser):
    """The DOM Chromium built, read back: its elements and its text."""

    def __init__(self, serialised: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.words: list[str] = []
        self.feed(serialised)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)

    def handle_data(self, data: str) -> None:
        self.words += data.split()

    @property
    def text(self) -> str:
        return " ".join(self.words)


def test_the_recorded_xid_79_run_renders_its_fault_between_the_failed_and_the_resubmitted_attempt(tmp_path):
    run = tmp_path / "supervised-20261126-042840"
    shutil.copytree(REPO / "tests" / "data" / "runs" / "xid79-resubmit", run)
    page = tmp_path / "report.html"
    assert CliRunner().invoke(cli, ["report", str(run), "--html", str(page)]).exit_code == 0

    shown = render(page, tmp_path)

    assert (shown.width, shown.height) == (WIDTH, HEIGHT)
    white = sum(row.count(b"\xff\xff\xff") for row in shown.rows)  # a lower bound: triples may straddle pixels
    assert white < 0.97 * WIDTH * HEIGHT, "the page rendered (nearly) blank"
    # The timeline's attempts lane: the rows where the attempts' bars are (more than a legend swatch wide).
    failed = list(shown.pixels(ENDED_COLOUR))
    completed = list(shown.pixels(COMPLETED_COLOUR))
    bar_rows = {y for _, y in completed if sum(1 for _, yy in completed if yy == y) > 100}
    assert bar_rows, "no attempt bar rendered"
    bar_bottom = max(bar_rows)
    failed_end = max(x for x, y in failed if y in bar_rows)
    resubmitted_start = min(x for x, y in completed if y in bar_rows)
    fault = [(x, y) for x, y in shown.pixels(FAULT_COLOUR) if bar_bottom < y < bar_bottom + 80]
    assert len(fault) > 30, "no fault marker under the attempts"
    fault_x = sum(x for x, _ in fault) / len(fault)
    assert failed_end - 10 <= fault_x <= resubmitted_start, (failed_end, fault_x, resubmitted_start)
    dom = Dom(shown.dom)
    assert "node2: Xid 79 on gpu3" in dom.text and "resubmit from step 20" in dom.text
    assert "work redone after failures 1.2 s" in dom.text and "restarts 1.8 s" in dom.text
    assert "script" not in dom.tags
    # Both time axes read as UTC clock times at round ticks; the loss axis as round values.
    assert "04:28:42 04:28:44 04:28:46" in dom.text and "5 6 7 8" in dom.text
    # The training curves under it, on the same time axis: the loss (then tokens/s) of the failed attempt up
    # to the fault, nothing while the job was lost and queued again, the resubmitted attempt's after.
    assert "Training curves" in dom.text and "loss, tokens/s, MFU (%): from the jobs' training series" in dom.text
    assert {"polyline", "circle"} <= dom.tags
    curve = list(shown.pixels(CURVE_COLOUR))
    assert curve and min(y for _, y in curve) > bar_bottom + 300, "no training curve under the timeline"
    columns = sorted({x for x, _ in curve})
    gaps = [(a, b) for a, b in zip(columns, columns[1:]) if b - a > 100]
    # (The failed attempt's last point is its agent's last summary, written as the step ended: within a second
    # of Slurm's end, a whole second cut, where the fault is marked.)
    assert len(gaps) == 1 and fault_x - 10 < gaps[0][0] < fault_x + 50 and gaps[0][1] > resubmitted_start, \
        (gaps, fault_x, resubmitted_start)
    # ...with the fault and the resubmission as dashed lines across it, where the timeline has them.
    resubmit = [x for x, y in shown.pixels(RECOVERY_COLOUR) if bar_bottom < y < bar_bottom + 80]  # its marker
    resubmit_x = sum(resubmit) / len(resubmit)
    top = min(y for _, y in curve) - 20
    fault_line = {x for x, y in shown.pixels(FAULT_COLOUR) if y > top}
    recovery_line = {x for x, y in shown.pixels(RECOVERY_COLOUR) if y > top}
    assert fault_line and all(abs(x - fault_x) < 3 for x in fault_line), (fault_line, fault_x)
    assert recovery_line and all(abs(x - resubmit_x) < 3 for x in recovery_line), (recovery_line, resubmit_x)


def test_a_hostile_blame_reason_renders_as_text_in_a_browser(tmp_path):
    run = create_run(tmp_path / "llm", load_spec(REPO / "examples" / "toy_trainer.toml"), "")
    hostile = '<script>document.title="ran"</script>"><img src=x onerror=alert(1)>'
    run.record(Submitted(at=100.0, attempt=1, job_id="4"))
    run.record(Decided(at=201.0, attempt=1, job_id="4", state="FAILED", exit_code=3, outcome=OutcomeKind.NODE_FAILURE,
                       message="FAILED", checkpoint_step=None, checkpoint=None, action=DecisionAction.STOP,
                       times=SlurmTimes(100.0, 110.0, 200.0), blame=(BlamedNode("node3", hostile),)))
    page = tmp_path / "report.html"
    assert CliRunner().invoke(cli, ["report", str(run.path), "--html", str(page)]).exit_code == 0

    dom = Dom(render(page, tmp_path).dom)

    assert hostile in dom.text and "script" not in dom.tags and "img" not in dom.tags
    assert "clusterctl report: llm" in dom.text  # the title the page set, not one a script set
