"""The signals benchmark at its smallest (`--quick`): it runs, the agent hears every report, and (a), (b) and (d) are seen."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "signals_bench.py"


def test_the_quick_bench_sees_a_drain_and_a_freeze_and_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "signals.json"
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--json", str(out)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    latency = result["latency_s"]
    for kind in ("a_drain", "b_frozen"):
        assert latency[kind]["missed"] == 0 and latency[kind]["n"] == 2, latency[kind]
        assert all(math.isfinite(v) and v >= 0 for v in latency["values"][kind])
        assert latency[kind]["p99"] < 5.0
    assert latency["b_frozen"]["min"] >= result["policy"]["stopped_grace"] - 0.05  # the grace is in, by design
    assert {"latency", "window_steps", "window_s", "bound_s"} <= set(latency["c_straggler"])
    # (d) a cut node: its neighbours name it, two probes go unanswered (0.5 s each, 0.25 s apart): blamed
    assert latency["d_cut"]["missed"] == 0 and latency["d_cut"]["n"] == 2, latency["d_cut"]
    assert 2.5 + 2 * 0.5 <= latency["d_cut"]["min"] and latency["d_cut"]["max"] < 10.0
    steady = result["steady"]
    for figure in ("cpu_share", "reports_per_s", "bytes_per_s", "summary_files_per_s"):
        assert steady[figure]["n"] == 2 and "median" in steady[figure], figure
    assert steady["reports_per_s"]["median"] > 0 and steady["bytes_per_s"]["median"] > 0
    assert result["peak_rss_mb"] > 0
    datagrams = result["datagrams"]
    assert datagrams["sent"] > 0 and datagrams["received"] > 0 and datagrams["refused"] == 0
    assert datagrams["dropped"] == datagrams["sent"] - datagrams["received"]
    assert result["new_derived"]["slurm_rpcs_per_s_from_reports"] == 0
    assert {"sweep_table_reads_per_s", "summary_files_per_s"} <= set(result["new_derived"])
    old = result["old"]
    assert old["files"] == result["nodes"] * 8
    assert "median" in old["write_ms_per_file"] and "median" in old["read_s_per_full_read"]
    assert old["derived"]["node_read_interval_s"] == max(2.0, 0.25 * result["nodes"])
    assert "| (a) healthd drains a node" in done.stdout
