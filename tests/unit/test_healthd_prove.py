"""`healthd prove`: a node proven with a known-good neighbour, judged against the fleet's healthy median."""

from __future__ import annotations

import json
import math
import socket
import threading

from click.testing import CliRunner
from hypothesis import given, strategies as st

from clusterctl.errors import SlurmCommandError
from clusterctl.healthd.cli import cli
from clusterctl.healthd.config import config_from_mapping
from clusterctl.healthd.proof_link import answer, measure
from clusterctl.healthd.proof_verdict import (
    Measurement, ProofLimits, UnreadableOutput, judge, read_link_test, read_nccl_tests,
)
from clusterctl.healthd.prove import ProofRequest, ProveSettings, choose_neighbour, describe, proof_argv, run_proof
from clusterctl.records.healthd_proof import ProofResult, append_proof, read_proofs
from clusterctl.records.versioned import RecordError
from clusterctl.slurm.commands import Completed

import pytest

NCCL_TESTS_OUTPUT = """\
# nThread 1 nGpus 1 minBytes 8 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2     float     sum      -1    38.47    0.00    0.00      0    37.29    0.00    0.00      0
        1024           256     float     sum      -1    45.10    0.02    0.04      0    44.80    0.02    0.04      0
  1073741824     268435456     float     sum      -1   8763.2  122.53  229.74      0   8750.1  122.71  230.08      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 76.6
"""

LIMITS = ProofLimits(bandwidth_share=0.8, latency_factor=1.5, min_history=3, floor_bandwidth_gbs=0.1,
                     ceiling_latency_us=1000.0)


def passed(bandwidth: float, latency: float, test: str = "tcp", at: float = 1.0) -> ProofResult:
    return ProofResult("n1", "n2", test, "pass", at, 1.0, bandwidth, latency)


def test_a_proof_round_trips_and_a_newer_one_is_refused(tmp_path):
    path = tmp_path / "proofs.jsonl"
    result = ProofResult("gpu-7", "gpu-3", "tcp", "fail", 1700000000.0, 2.5, 1.2, 40.0, 2.0, 30.0,
                         "median of 5 passing proofs of tcp", ("bandwidth 1.2 GB/s below 2 GB/s",), "evidence")
    append_proof(path, result)
    append_proof(path, passed(3.0, 20.0))
    assert read_proofs(path) == (result, passed(3.0, 20.0))
    assert read_proofs(tmp_path / "none.jsonl") == ()
    newer = {**result.to_json(), "version": 2}
    path.write_text(json.dumps(newer) + "\n")
    with pytest.raises(RecordError, match="newer"):
        read_proofs(path)


def test_without_history_the_absolute_floors_judge():
    verdict = judge(Measurement(0.05, 20.0), (), "tcp", LIMITS)
    assert not verdict.passed and "absolute floors" in verdict.thresholds.basis
    assert verdict.reasons == ("bandwidth 0.05 GB/s below 0.1 GB/s",)
    assert judge(Measurement(5.0, 20.0), (), "tcp", LIMITS).passed


def test_with_history_the_fleet_median_judges_and_other_tests_do_not_count():
    history = [passed(10.0, 20.0), passed(12.0, 22.0), passed(11.0, 21.0), passed(1.0, 999.0, test="nccl")]
    slow = judge(Measurement(5.0, 21.0), history, "tcp", LIMITS)
    assert not slow.passed and "median of 3 passing proofs of tcp" in slow.thresholds.basis
    assert slow.thresholds.min_bandwidth_gbs == pytest.approx(8.8)
    assert judge(Measurement(9.0, 30.0), history, "tcp", LIMITS).passed
    assert not judge(Measurement(9.0, 40.0), history, "tcp", LIMITS).passed  # 40 > 1.5 × 21


finite = st.floats(0.001, 1e4)


@given(st.lists(st.tuples(finite, finite), max_size=12), finite, finite, st.floats(0, 1e4), st.floats(0, 1e4))
def test_more_bandwidth_or_less_latency_never_turns_a_pass_into_a_fail(past, bandwidth, latency, more, less):
    history = [passed(b, lat) for b, lat in past]
    if judge(Measurement(bandwidth, latency), history, "tcp", LIMITS).passed:
        assert judge(Measurement(bandwidth + more, max(latency - less, 0.0)), history, "tcp", LIMITS).passed


@given(st.lists(st.tuples(finite, finite), min_size=3, max_size=12))
def test_a_node_as_good_as_the_fleet_median_passes(past):
    import statistics

    history = [passed(b, lat) for b, lat in past]
    median = Measurement(statistics.median(b for b, _ in past), statistics.median(lat for _, lat in past))
    assert judge(median, history, "tcp", LIMITS).passed


@given(st.sampled_from([math.nan, math.inf, -math.inf]))
def test_a_measurement_that_is_not_a_number_fails(value):
    assert not judge(Measurement(value if value != math.inf else math.nan, 10.0), (), "tcp", LIMITS).passed
    assert not judge(Measurement(5.0, math.nan), (), "tcp", LIMITS).passed


def test_nccl_tests_output_reads_as_bus_bandwidth_at_the_largest_size_and_time_at_the_smallest():
    measured = read_nccl_tests(NCCL_TESTS_OUTPUT)
    assert (measured.bandwidth_gbs, measured.latency_us, measured.problems) == (229.74, 38.47, ())
    wrong = NCCL_TESTS_OUTPUT.replace("229.74      0", "229.74      3")
    assert read_nccl_tests(wrong).problems == ("wrong results at 1073741824 bytes (3 elements)",)
    assert not judge(read_nccl_tests(wrong), (), "nccl", LIMITS).passed
    with pytest.raises(UnreadableOutput):
        read_nccl_tests("srun: error: gpu-7: task 0: Exited with exit code 1\n")


@given(st.text(max_size=400))
def test_any_output_reads_as_a_measurement_or_unreadable(text):
    for reader in (read_nccl_tests, read_link_test):
        try:
            reader(text)
        except UnreadableOutput:
            pass


def test_the_link_test_measures_over_a_connected_pair():
    left, right = socket.socketpair()
    with left, right:
        peer = threading.Thread(target=answer, args=(right, 4 << 20, 50))
        peer.start()
        result = measure(left, 4 << 20, 50)
        peer.join(5)
    assert result.bandwidth_gbs > 0 and result.latency_us > 0
    assert read_link_test("noise\n" + result.line()) == Measurement(round(result.bandwidth_gbs, 6),
                                                                   round(result.latency_us, 3))


class FakeSrun:
    """Replays one srun answer and keeps the argv it was given."""

    def __init__(self, answer: Completed | Exception) -> None:
        self.answer, self.calls = answer, []

    def __call__(self, argv, timeout):
        self.calls.append((list(argv), timeout))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


REQUEST = ProofRequest("gpu-7", "gpu-3", reservation="maint")
NCCL = ProveSettings(argv=("/opt/nccl-tests/all_reduce_perf", "-b", "8", "-e", "1G"), srun_options=("--gpus-per-node=8",),
                     tasks_per_node=8)


def test_the_srun_runs_the_site_test_on_both_nodes_in_the_reservation():
    argv = proof_argv(REQUEST, NCCL)
    assert argv[0] == "srun" and "--nodelist=gpu-7,gpu-3" in argv and "--reservation=maint" in argv
    assert "--ntasks=16" in argv and "--gpus-per-node=8" in argv and argv[-5:] == list(NCCL.argv)
    builtin = proof_argv(REQUEST, ProveSettings(python="/usr/bin/python3"))
    assert builtin[-8:-5] == ["/usr/bin/python3", "-m", "clusterctl.healthd"] and "--ntasks-per-node=1" in builtin


def test_a_proof_passes_fails_or_says_why_it_could_not_run():
    clock = iter(range(100, 200)).__next__
    good = run_proof(REQUEST, NCCL, FakeSrun(Completed(0, NCCL_TESTS_OUTPUT, "")), (), clock)
    assert good.outcome == "pass" and good.bandwidth_gbs == 229.74 and "absolute floors" in good.basis
    history = [passed(400.0, 30.0, test=NCCL.test)] * 5
    slow = run_proof(REQUEST, NCCL, FakeSrun(Completed(0, NCCL_TESTS_OUTPUT, "")), history, clock)
    assert slow.outcome == "fail" and slow.reasons == ("bandwidth 230 GB/s below 320 GB/s",)
    drained = run_proof(REQUEST, NCCL, FakeSrun(Completed(1, "", "srun: error: Unable to allocate resources: "
                                                            "Requested node configuration is not available")), (), clock)
    assert drained.outcome == "error" and "reservation" in drained.reasons[0]
    hung = run_proof(REQUEST, NCCL, FakeSrun(SlurmCommandError(["srun"], None, "no answer within 750 s")), (), clock)
    assert hung.outcome == "error" and "no answer" in hung.reasons[0]
    assert describe(slow)[0] == "gpu-7 with gpu-3 (/opt/nccl-tests/all_reduce_perf -b 8 -e 1G): FAILED"


def test_the_neighbour_is_an_idle_node_other_than_the_one_proven():
    assert choose_neighbour("gpu-7", ["gpu-7", "gpu-2"]) == "gpu-2"
    assert choose_neighbour("gpu-7", ["gpu-7"]) is None


def test_prove_settings_come_from_healthd_toml():
    config = config_from_mapping({"prove": {"argv": ["/opt/all_reduce_perf", "-b", "8"], "parser": "nccl-tests",
                                            "bandwidth_share": 0.7, "reservation": "maint"}})
    assert config.prove.argv == ("/opt/all_reduce_perf", "-b", "8") and config.prove.limits.bandwidth_share == 0.7
    for bad in ({"argv": "all_reduce_perf -b 8"}, {"argv": ["all_reduce_perf"]}, {"parser": "dcgmi"},
                {"bandwidth_share": 2}):
        with pytest.raises(Exception, match="prove"):
            config_from_mapping({"prove": bad})


def test_prove_dry_run_prints_the_srun_and_bad_input_is_one_line(tmp_path):
    config = tmp_path / "healthd.toml"
    config.write_text(f'journal_dir = "{tmp_path}"\n[prove]\npython = "/usr/bin/python3"\n')
    shown = CliRunner().invoke(cli, ["prove", "gpu-7", "--with", "gpu-3", "--partition", "maint", "--dry-run",
                                     "--config", str(config)])
    assert shown.exit_code == 0 and shown.output.startswith("srun --job-name=healthd-prove")
    assert "--partition=maint" in shown.output
    bad = CliRunner().invoke(cli, ["prove", "--help-me", "--config", str(config)])
    assert bad.exit_code == 2
    bad = CliRunner().invoke(cli, ["prove", "gpu-7", "--with", "-x;rm", "--config", str(config)])
    assert bad.exit_code == 2 and "not a node name" in bad.output
    same = CliRunner().invoke(cli, ["prove", "gpu-7", "--with", "gpu-7", "--config", str(config)])
    assert same.exit_code == 2
