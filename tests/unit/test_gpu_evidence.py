"""What a node's GPUs say (healthd evidence) reads back as written, and says in sentences what
explains a slowdown, and nothing when nothing does."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clusterctl.records.gpu_evidence import GpuEvidence, GpuReading, clock_reason_names
from clusterctl.records.versioned import RecordError

READINGS = st.builds(GpuReading, index=st.integers(0, 127), uuid=st.text(max_size=40),
                     clock_event_reasons=st.integers(0, 2**16), sm_clock_mhz=st.none() | st.integers(0, 5000),
                     sm_clock_max_mhz=st.none() | st.integers(0, 5000), temperature_c=st.none() | st.integers(0, 150),
                     ecc_corrected_volatile=st.integers(0, 2**40), ecc_uncorrected_volatile=st.integers(0, 2**40),
                     remapped_pending=st.booleans(), findings=st.lists(st.text(max_size=30), max_size=3).map(tuple))
EVIDENCE = st.builds(GpuEvidence, node=st.text(min_size=1, max_size=20), at=st.floats(0, 4e9, allow_nan=False),
                     gpus=st.lists(READINGS, max_size=8).map(tuple),
                     problems=st.lists(st.text(max_size=30), max_size=2).map(tuple), scope=st.text(max_size=40))


@given(EVIDENCE)
def test_evidence_reads_back_as_written(evidence):
    assert GpuEvidence.from_json(json.loads(json.dumps(evidence.to_json())), "here") == evidence


def test_a_thermally_throttled_gpu_is_named_with_its_reasons_clock_and_temperature():
    evidence = GpuEvidence("node2", 1.0, (GpuReading(0, clock_event_reasons=0x1, sm_clock_mhz=1980, sm_clock_max_mhz=1980),
                                          GpuReading(3, clock_event_reasons=0x60, sm_clock_mhz=792,
                                                     sm_clock_max_mhz=1980, temperature_c=91)))
    assert evidence.slowdown_reasons() == (
        "GPU 3: clock event reasons SW thermal slowdown, HW thermal slowdown (0x60); SM clock 792/1980 MHz (40%); "
        "91 °C",)
    assert evidence.slowdown_reasons(gpus=[0, 1]) == ()


def test_an_idle_or_power_capped_gpu_at_full_clocks_explains_nothing():
    evidence = GpuEvidence("node1", 1.0, (GpuReading(0, clock_event_reasons=0x1 | 0x4, sm_clock_mhz=1900,
                                                     sm_clock_max_mhz=1980, temperature_c=60),))
    assert evidence.slowdown_reasons() == ()
    assert evidence.to_text()[-1] == "slowed: nothing here explains a slowdown"


def test_low_clocks_a_reason_bit_accounts_for_by_design_explain_nothing():
    # A busy GPU at its (site's) power cap, an idle one, application clocks: none is a fault.
    evidence = GpuEvidence("node1", 1.0, tuple(GpuReading(i, clock_event_reasons=bit, sm_clock_mhz=1200,
                                                          sm_clock_max_mhz=1980) for i, bit in enumerate((0x4, 0x1, 0x2))))
    assert evidence.slowdown_reasons() == ()


def test_a_hot_gpu_healthd_warned_about_counts_and_the_clock_is_shown_without_its_maximum():
    evidence = GpuEvidence("node1", 1.0, (
        GpuReading(0, temperature_c=89, findings=("thermal: temperature high (warn)",)),
        GpuReading(1, clock_event_reasons=0x80, sm_clock_mhz=600),
        GpuReading(2, temperature_c=95)))
    assert evidence.slowdown_reasons() == (
        "GPU 0: healthd: thermal: temperature high (warn); 89 °C",
        "GPU 1: clock event reasons HW power brake slowdown (0x80); SM clock 600 MHz (maximum unknown)")


def test_the_text_for_people_names_each_gpu_its_remap_and_the_problems():
    evidence = GpuEvidence("node3", 1.0, (GpuReading(0, "GPU-a", 0x60, 792, 1980, 91, 2, 0, True),),
                           ("healthd state: not readable (permission denied)",))
    assert evidence.to_text() == [
        "node3: 1 GPUs",
        "GPU 0 GPU-a: SM clock 792/1980 MHz (40%); clock event reasons SW thermal slowdown, HW thermal slowdown "
        "(0x60); 91 °C; ECC volatile corrected 2, uncorrected 0; row remap pending",
        "slowed: GPU 0: clock event reasons SW thermal slowdown, HW thermal slowdown (0x60); "
        "SM clock 792/1980 MHz (40%); 91 °C",
        "problem: healthd state: not readable (permission denied)"]


def test_low_clocks_with_no_reason_given_and_healthds_findings_still_count():
    evidence = GpuEvidence("node1", 1.0, (
        GpuReading(1, sm_clock_mhz=990, sm_clock_max_mhz=1980),
        GpuReading(2, findings=("clock-events: clock event reasons 0x40 for 312 s (warn)",)),
        GpuReading(4, findings=("ecc-sbe: 3 corrected (ignore)",))))
    assert evidence.slowdown_reasons() == (
        "GPU 1: SM clock 990/1980 MHz (50%) with no reason given",
        "GPU 2: healthd: clock-events: clock event reasons 0x40 for 312 s (warn)")


def test_reason_bits_are_named_as_nvidia_names_them():
    # nvml.h's nvmlClocksEventReason* (nvidia-nvml-dev), bit by bit.
    assert clock_reason_names(0x8 | 0x80 | 0x1000) == ("HW slowdown", "HW power brake slowdown", "unknown 0x1000")
    assert clock_reason_names(0x7FF) == (
        "GPU idle", "applications clocks setting", "SW power cap", "HW slowdown", "sync boost", "SW thermal slowdown",
        "HW thermal slowdown", "HW power brake slowdown", "display clock setting", "board limit", "reliability")
    assert clock_reason_names(0) == ()


@pytest.mark.parametrize("change, message", [
    ({"kind": "gpu-state"}, "not a gpu-evidence record"),
    ({"version": 3}, "version 3 is newer than this clusterctl understands"),
    ({"version": 1}, "version 1 is older than this clusterctl reads"),  # a healthd from before `scope`
    ({"scope": None}, "field `scope` has the wrong type"),
    ({"gpus": [{**GpuReading(0).to_json(), "index": "3"}]}, r"gpus\[0\]: field `index` has the wrong type"),
    ({"gpus": [{**GpuReading(0).to_json(), "remapped_pending": 1}]}, "field `remapped_pending` has the wrong type"),
    ({"gpus": [{**GpuReading(0).to_json(), "sm_clock_mhz": 1.5}]}, "field `sm_clock_mhz` has the wrong type"),
    ({"problems": "none"}, "field `problems` has the wrong type"),
    ({"at": None}, "field `at` has the wrong type"),
])
def test_a_record_this_clusterctl_does_not_understand_is_refused(change, message):
    good = GpuEvidence("node1", 1.0, (GpuReading(0),)).to_json()
    with pytest.raises(RecordError, match=message):
        GpuEvidence.from_json({**good, **change}, "srun healthd evidence")
