"""Slurm 22.05's JSON job reports, as recorded on the testbed."""

from __future__ import annotations

import pytest

from clusterctl.errors import SlurmCommandError
from clusterctl.slurm.jobs import parse_sacct_json, parse_sbatch_parsable, parse_squeue_json
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "slurm"


def test_squeue_lists_every_job_with_its_exit_status_decoded():
    jobs = parse_squeue_json((DATA / "squeue.json").read_text())
    assert set(jobs) == {"1", "2", "3", "4", "5", "6"}
    failed, cancelled, running = jobs["4"], jobs["5"], jobs["6"]
    assert (failed.state, failed.reason, failed.exit_code, failed.nodes) == ("FAILED", "NonZeroExitCode", 3, "node1")
    assert (cancelled.state, cancelled.signal) == ("CANCELLED", 15)
    assert running.state == "RUNNING" and not running.terminal and running.exit_code is None
    assert jobs["1"].nodes == "node[1,3]" and jobs["1"].terminal


def test_sacct_gives_steps_with_their_nodes_and_exit_codes():
    jobs = parse_sacct_json((DATA / "sacct.json").read_text())
    first = jobs["1"]
    assert first.state == "COMPLETED" and first.source == "sacct"
    assert [(s.step, s.name, s.nodes) for s in first.steps] == [("batch", "batch", ("node1",)),
                                                                 ("0", "bash", ("node1", "node3"))]
    assert jobs["5"].steps[0].signal == 15


def test_sbatch_parsable_output_and_garbage():
    assert parse_sbatch_parsable("1234\n") == "1234"
    assert parse_sbatch_parsable("1234;cluster\n") == "1234"
    with pytest.raises(SlurmCommandError, match="unexpected output"):
        parse_sbatch_parsable("sbatch: error: Batch job submission failed")
    with pytest.raises(SlurmCommandError, match="not JSON"):
        parse_squeue_json("<html>")
