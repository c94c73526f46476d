"""The series benchmark at its smallest: it runs, reads every point, and keeps the spike, the NaNs and the dip."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "series_bench.py"


def test_the_series_bench_reads_a_small_series_and_reports_each_figure(tmp_path: Path) -> None:
    out = tmp_path / "series.json"
    done = subprocess.run([sys.executable, str(BENCH), "--lines", "20000", "--trials", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["lines"] == 20000 and result["bytes"] > 20000 * 300
    for what in ("read + thin", "ends"):
        assert result["seconds"][what]["n"] == 1 and result["seconds"][what]["median"] > 0
        assert result["peak_rss_mb"][what]["median"] > 0
    assert result["trials"]["read + thin"][0]["points"]["loss"] <= 1000
    assert "| read + thin |" in done.stdout
