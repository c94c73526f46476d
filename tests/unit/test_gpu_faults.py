"""Fault injection into the emulated GPUs: what each fault does to the state files."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("clusterctl_testbed", reason="tests the testbed package: pip install -e ./testbed")

from clusterctl_testbed.gpu_faults import FAULT_KINDS, Fault, apply_fault, inject, parse_state, render_state  # noqa: E402


def test_xid_79_is_an_event_then_a_lost_gpu():
    effect = apply_fault({}, Fault("xid", gpu=3, value=79), now=100.0)
    assert effect.events == ["3 xid 79"]
    assert effect.state == {"gpu.3.lost": "1"}
    assert effect.kernel_messages == ["NVRM: Xid (PCI:0000:5d:00): 79, pid=1, GPU has fallen off the bus."]


def test_app_xid_leaves_the_gpu_usable():
    effect = apply_fault({}, Fault("xid", gpu=1, value=13), now=0)
    assert effect.state == {} and effect.events == ["1 xid 13"]


def test_counters_accumulate_and_clear_resets():
    state: dict[str, str] = {}
    for _ in range(3):
        state = apply_fault(state, Fault("ecc-dbe", gpu=2), now=0).state
    assert state["gpu.2.ecc.volatile.dbe"] == "3" and state["gpu.2.ecc.aggregate.dbe"] == "3"
    assert apply_fault(state, Fault("clear"), now=0).state == {}


def test_nvml_hang_is_a_deadline():
    effect = apply_fault({}, Fault("nvml-hang", function="nvmlDeviceGetTemperature", seconds=2.5), now=1000.0)
    assert effect.state == {"hang.nvmlDeviceGetTemperature": "1002.500"}


def test_nvlink_faults_build_a_mask():
    state = apply_fault({}, Fault("nvlink-down", gpu=0, value=2), now=0).state
    state = apply_fault(state, Fault("nvlink-down", gpu=0, value=5), now=0).state
    assert state["gpu.0.nvlink.down"] == hex((1 << 2) | (1 << 5))


@given(st.dictionaries(st.from_regex(r"gpu\.[0-7]\.[a-z.]{1,12}", fullmatch=True),
                       st.integers(0, 10**9).map(str)))
def test_state_file_round_trips(state):
    assert parse_state(render_state(state)) == state


def test_inject_writes_state_events_and_kernel_log(tmp_path):
    inject(tmp_path, Fault("xid", gpu=0, value=48))
    inject(tmp_path, Fault("remap-failure", gpu=4))
    assert (tmp_path / "events").read_text() == "0 xid 48\n"
    assert parse_state((tmp_path / "state").read_text()) == {"gpu.4.remap.failure": "1"}
    kmsg = (tmp_path / "kmsg").read_text().splitlines()
    assert [line.split(",")[1] for line in kmsg] == ["0", "1"]  # sequence numbers keep counting
    assert kmsg[1].endswith("NVRM: Xid (PCI:0000:9a:00): 64, pid=1, Row Remapper: Failed")
    assert not list(tmp_path.glob(".state.*")), "no temp file left behind"


def test_every_fault_kind_leaves_a_mark_on_the_emulated_gpu():
    for kind in FAULT_KINDS:
        if kind == "clear":
            continue
        effect = apply_fault({}, Fault(kind, gpu=1, value=1, function="nvmlDeviceGetTemperature", seconds=1), now=0)
        assert effect.state or effect.events or effect.kernel_messages, f"fault {kind} changed nothing"


def test_an_unknown_fault_kind_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="unknown fault 'melt'; known: xid, kmsg-xid"):
        apply_fault({}, Fault("melt"), now=0)


def test_a_throttle_keeps_a_share_of_the_sm_clock_with_thermal_reasons_and_100_percent_ends_it():
    state = apply_fault({"gpu.1.temp": "80"}, Fault("throttle", gpu=1, value=40), now=0).state
    assert state == {"gpu.1.temp": "80", "gpu.1.clocks_event_reasons": "0x60", "gpu.1.clocks.sm": "792"}
    assert apply_fault(state, Fault("throttle", gpu=1, value=100), now=0).state == {"gpu.1.temp": "80"}
    assert apply_fault({}, Fault("throttle", gpu=0), now=0).state["gpu.0.clocks.sm"] == "990"  # default: half
    with pytest.raises(ValueError, match="percentage"):
        apply_fault({}, Fault("throttle", value=150), now=0)
