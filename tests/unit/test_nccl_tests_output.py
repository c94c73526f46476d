"""`healthd prove` reads nccl-tests' real output (tests/data/nccl-tests/README.md says where each file is from)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from clusterctl.healthd.proof_verdict import Measurement, ProofLimits, UnreadableOutput, judge, read_nccl_tests
from clusterctl.healthd.prove import ProofRequest, ProveSettings, run_proof
from clusterctl.slurm.commands import Completed

DATA = Path(__file__).resolve().parent.parent / "data" / "nccl-tests"
COMPLETE = ("v2.18.3-all_gather-2nodes-mpirun.txt", "v2.1x-all_reduce-2nodes-efa-nccl-info.txt",
            "rccl-tests-all_reduce-4nodes-srun-label.txt", "v2.0-2.11-all_reduce-error-column.txt")
LIMITS = ProofLimits()


def sample(name: str) -> str:
    return (DATA / name).read_text()


@pytest.mark.parametrize("name, bandwidth, latency", [
    # out-of-place busbw at the largest size; out-of-place time at the smallest
    ("v2.18.3-all_gather-2nodes-mpirun.txt", 22.14, 27211.0),
    ("v2.1x-all_reduce-2nodes-efa-nccl-info.txt", 12.37, 45.91),
    ("rccl-tests-all_reduce-4nodes-srun-label.txt", 92.89, 78.91),
    ("v2.0-2.11-all_reduce-error-column.txt", 0.49, 32.53),
])
def test_real_runs_read_as_out_of_place_bus_bandwidth_at_the_largest_size(name, bandwidth, latency):
    assert read_nccl_tests(sample(name)) == Measurement(bandwidth, latency, ())


def test_a_nonzero_wrong_count_fails_the_proof_and_says_where():
    # nccl-tests prints the count with %6g (src/util.cu); NVIDIA/nccl#2001 saw wrong elements at 1048576 bytes.
    text = sample("v2.1x-all_reduce-2nodes-efa-nccl-info.txt").replace(
        "272.8    3.84    3.84      0    272.6    3.85    3.85      0",
        "272.8    3.84    3.84  1.6e+04    272.6    3.85    3.85      2").replace(
        "Out of bounds values : 0 OK", "Out of bounds values : 16386 FAILED")
    measured = read_nccl_tests(text)
    assert measured.problems == ("wrong results at 1048576 bytes (1.6e+04/2 elements)",
                                 "nccl-tests found 16386 out-of-bounds values (wrong results)")
    verdict = judge(measured, (), "nccl", LIMITS)
    assert not verdict.passed and "wrong results at 1048576 bytes" in verdict.reasons[0]


def test_the_old_error_column_is_a_deviation_and_only_out_of_bounds_fails():
    old = sample("v2.0-2.11-all_reduce-error-column.txt").replace("0.49  0e+00", "0.49  1e-06")
    assert read_nccl_tests(old).problems == ()
    failed = old.replace("Out of bounds values : 0 OK", "Out of bounds values : 248 FAILED")
    assert read_nccl_tests(failed).problems == ("nccl-tests found 248 out-of-bounds values (wrong results)",)


def test_no_result_counted_with_minus_c_0_is_not_a_problem():
    text = sample("v2.18.3-all_gather-2nodes-mpirun.txt").replace("22.46       0", "22.46     N/A")
    assert read_nccl_tests(text).problems == ()


def test_per_iteration_and_timestamp_columns_do_not_move_the_bandwidth():
    # v2.19.2's -I 1 adds i_min i_max i_p99 i_cv% after each half, v2.17.6 a two-word timestamp (src/util.cu).
    header = ("#       size         count      type   redop    root     time   algbw   busbw  #wrong    i_min    i_max"
              "    i_p99    i_cv%     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%           timestamp")
    row = ("  1073741824     268435456     float     sum      -1    86786   12.37   12.37       0  86001.2  88012.0"
           "  88012.0     0.61    86676   12.39   12.39       0  86100.0  87002.5  87002.5     0.42 2026-07-09 10:01:02")
    measured = read_nccl_tests(f"{header}\n{row}\n# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 12.38 \n")
    assert measured == Measurement(12.37, 86786.0, ())


def test_a_size_printed_twice_counts_at_its_worst():
    text = sample("v2.18.3-all_gather-2nodes-mpirun.txt")
    slower = text.replace("96986.7   44.28   22.14", "190841    5.63    2.81").replace("27211.0", "30000.0")
    assert read_nccl_tests(text + slower) == Measurement(2.81, 30000.0, ())


@pytest.mark.parametrize("name, said", [
    ("v2.13plus-all_reduce-aborted-after-rows.txt",
     "nccl-tests did not finish: no '# Avg bus bandwidth' line after 5 result rows (the last at 17179869184 bytes); "
     "it said: HCA-128: Test NCCL failure common.cu:1204 'unhandled cuda error"),
    ("v2.9-all_reduce-aborted-before-rows.txt",
     "no nccl-tests table: no column header line (# size count type ... busbw); "
     "it said: fastmoe: Test NCCL failure common.cu:777 'unhandled system error'"),
])
def test_an_aborted_run_is_unreadable_and_says_what_was_missing_and_what_the_test_said(name, said):
    with pytest.raises(UnreadableOutput) as raised:
        read_nccl_tests(sample(name))
    assert str(raised.value).startswith(said)


def test_an_aborted_run_is_not_proven_through_healthd_prove():
    settings = ProveSettings(argv=("/opt/nccl-tests/all_reduce_perf", "-b", "1G", "-e", "16G"))

    def srun(argv, timeout):
        return Completed(3, sample("v2.13plus-all_reduce-aborted-after-rows.txt"), "srun: error: task 0: Exited")

    result = run_proof(ProofRequest("gpu-7", "gpu-3"), settings, srun, (), iter(range(100)).__next__)
    assert result.outcome == "error" and result.bandwidth_gbs is None
    assert "did not finish" in result.reasons[0] and "unhandled cuda error" in result.reasons[0]


@given(st.sampled_from(COMPLETE), st.data())
def test_a_run_cut_short_anywhere_before_its_summary_is_never_a_measurement(name, data):
    lines = sample(name).splitlines(keepends=True)
    summary = next(i for i, line in enumerate(lines) if "Avg bus bandwidth" in line)
    cut = data.draw(st.integers(0, summary))
    with pytest.raises(UnreadableOutput):
        read_nccl_tests("".join(lines[:cut]))


@given(st.sampled_from(COMPLETE), st.data())
def test_real_output_with_any_line_garbled_reads_or_is_unreadable(name, data):
    lines = sample(name).splitlines(keepends=True)
    at = data.draw(st.integers(0, len(lines) - 1))
    lines[at] = data.draw(st.text(max_size=200)) + "\n"
    try:
        read_nccl_tests("".join(lines))
    except UnreadableOutput:
        pass


@given(st.lists(st.sampled_from([
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
    "#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error",
    "           8             2     float     sum      -1    45.91    0.00    0.00      0    45.49    0.00    0.00      0",
    "           8             2   float     sum    32.53    0.00    0.00  nan    32.53    inf    0.00  0e+00",
    "# Out of bounds values : x FAILED", "# Out of bounds values :", "# Avg bus bandwidth    : 4.2 FAILED",
    " 0: # Avg bus bandwidth", "[1,0]<stdout>:  16 4 float sum -1 1 1 1 1 1 1 1 1", "x: Test NCCL failure",
]) | st.text(max_size=80), max_size=12))
def test_any_mix_of_table_fragments_reads_or_is_unreadable(lines):
    try:
        measured = read_nccl_tests("\n".join(lines))
    except UnreadableOutput:
        return
    assert measured.bandwidth_gbs is not None and measured.latency_us is not None
