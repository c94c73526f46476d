"""healthd on RoCE ports: the link's damaged frames drain, the transport's retransmissions only warn, and
congestion or the job's own errors are never a finding.  Trees are the testbed's own (mlx5's hw_counters
and a netdev's statistics), faults injected as the testbed injects them, the clock pinned."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterctl.healthd.checks import CheckLimits
from clusterctl.healthd.checks.network import NetworkMemory, check_network, read_nics
from clusterctl.healthd.config import ConfigError, config_from_mapping
from clusterctl.healthd.findings import Finding
from clusterctl.healthd.policy import drain_reason, judge
from clusterctl.records.actions import Action

pytest.importorskip("clusterctl_testbed", reason="builds its trees with the testbed package: pip install -e ./testbed")

from clusterctl_testbed.ib_faults import HW_COUNTERS, IbFault, build_tree, inject_ib  # noqa: E402

T0 = 1795305600.0
STEP = 15.0  # healthd's default check interval


class Node:
    """One node's RoCE tree and healthd's memory of it: `check(now)` is one periodic pass over its network."""

    def __init__(self, root: Path, limits: CheckLimits | None = None) -> None:
        self.root, self.limits, self.memory = root, limits or CheckLimits(), NetworkMemory()

    def check(self, now: float) -> list[Finding]:
        return check_network(read_nics(self.root), self.limits, self.memory, now)

    def hw_counter(self, name: str, nic: int = 0) -> Path:
        return self.root / f"sys/class/infiniband/mlx5_{nic}/ports/1/hw_counters/{name}"


@pytest.fixture()
def node(tmp_path) -> Node:
    build_tree(tmp_path, link_layer="Ethernet")
    return Node(tmp_path)


def details(findings: list[Finding]) -> list[tuple[str, str]]:
    return [(f.kind, f.detail) for f in findings]


def test_a_healthy_roce_node_reads_as_eight_ethernet_ports_and_finds_nothing(node):
    nics = read_nics(node.root)
    assert [(p.name, p.link_layer, p.state, p.rate_gbps) for p in nics.ports][:1] == [
        ("mlx5_0/1", "Ethernet", "ACTIVE", 400.0)]
    assert {p.link_layer for p in nics.ports} == {"Ethernet"}
    assert {name for name, _ in nics.ports[0].counters} >= {"rx_crc_errors", "local_ack_timeout_err", "out_of_sequence"}
    assert [node.check(T0 + STEP * i) for i in range(6)] == [[]] * 6


def test_an_infiniband_port_reads_no_roce_counters(tmp_path):
    build_tree(tmp_path, nics=1)
    (port,) = read_nics(tmp_path).ports
    assert port.link_layer == "InfiniBand"
    assert not {name for name, _ in port.counters} & {"rx_crc_errors", "local_ack_timeout_err"}


def test_damaged_frames_on_a_roce_port_drain_with_the_counter_in_slurms_reason(node):
    for i in range(3):
        assert node.check(T0 + STEP * i) == []
    inject_ib(node.root, IbFault("roce-fcs-errors", nic=2, value=40))
    (finding,) = node.check(T0 + 3 * STEP)
    assert (finding.kind, finding.detail) == ("ib-errors", "mlx5_2/1 rx_crc_errors 53.3/min > 10/min")
    verdict = judge(finding)
    assert verdict.action is Action.DRAIN_RESET
    assert drain_reason(finding, verdict, T0 + 45).render() == (
        "healthd: ib-errors [mlx5_2/1 rx_crc_errors 53.3/min > 10/min] drain-reset 2026-11-22T00:00:45Z")


def test_retransmissions_warn_naming_port_counter_and_rate_and_never_drain(node):
    for i in range(3):
        node.check(T0 + STEP * i)
    inject_ib(node.root, IbFault("roce-retransmits", nic=5, value=10))
    found = node.check(T0 + 3 * STEP)
    assert details(found) == [
        ("roce-retransmits", "mlx5_5/1 local_ack_timeout_err 13.3/min > 2/min"),
        ("roce-retransmits", "mlx5_5/1 packet_seq_err 400.0/min > 60/min"),
        ("roce-retransmits", "mlx5_5/1 out_of_sequence 400.0/min > 60/min"),
    ]
    assert {judge(f).action for f in found} == {Action.WARN}


def test_a_few_retransmissions_an_hour_are_no_finding(node):
    for i in range(40):
        if i % 20 == 10:
            inject_ib(node.root, IbFault("roce-retransmits", nic=1, value=1))  # 1 timeout, 30 sequence errors
        assert node.check(T0 + STEP * i) == []


def test_congestion_notifications_at_full_bandwidth_are_never_a_finding(node):
    for i in range(8):
        inject_ib(node.root, IbFault("roce-congestion", nic=0))  # 100,000 CNPs every pass
        assert node.check(T0 + STEP * i) == []


def test_the_jobs_own_errors_are_never_a_finding(node):
    node.check(T0)
    for name in ("out_of_buffer", "rnr_nak_retry_err", "req_cqe_flush_error", "resp_local_length_error",
                 "req_transport_retries_exceeded", "duplicate_request"):
        node.hw_counter(name).write_text("1000000\n")
    assert node.check(T0 + 60) == []


def test_a_32_bit_queue_pair_counter_wrapping_is_no_finding(node):
    counter = node.hw_counter("packet_seq_err", nic=3)
    counter.write_text(f"{2**32 - 5}\n")
    node.check(T0)
    counter.write_text("20\n")  # wrapped: 25 more, but read as a reset
    assert node.check(T0 + STEP) == []
    assert node.check(T0 + 4 * STEP) == []


def test_a_netdev_name_that_leaves_sys_class_net_is_not_followed(node, tmp_path):
    (node.root / "sys/class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/0").write_text("../../../etc\n")
    (port, *_) = read_nics(node.root).ports
    assert "rx_crc_errors" not in dict(port.counters)


def test_a_roce_fault_on_an_infiniband_port_is_refused_by_name(tmp_path):
    build_tree(tmp_path, nics=1)
    with pytest.raises(ValueError, match="mlx5_0/1 is not a RoCE port: roce-retransmits needs one"):
        inject_ib(tmp_path, IbFault("roce-retransmits"))


def test_the_roce_limits_are_read_and_checked():
    config = config_from_mapping({"checks": {"roce_ack_timeout_per_min": 30, "roce_fcs_errors_per_min": 1}})
    assert (config.checks.roce_ack_timeout_per_min, config.checks.roce_fcs_errors_per_min) == (30, 1)
    with pytest.raises(ConfigError, match="roce_seq_errors_per_min"):
        config_from_mapping({"checks": {"roce_seq_errors_per_min": -1}})


def test_a_raised_limit_is_what_the_warning_is_judged_against(node):
    quiet = Node(node.root, CheckLimits(roce_ack_timeout_per_min=100, roce_seq_errors_per_min=1000))
    quiet.check(T0)
    inject_ib(node.root, IbFault("roce-retransmits", nic=0, value=10))
    assert quiet.check(T0 + 45) == []


# ---- properties: whatever the transport counters do, a RoCE node is never drained for them ----------

NOT_JUDGED = tuple(name for name in HW_COUNTERS if name not in (
    "local_ack_timeout_err", "packet_seq_err", "implied_nak_seq_err", "out_of_sequence", "rx_icrc_encapsulated"))

steps = st.lists(st.tuples(st.floats(1.0, 600.0), st.sampled_from(HW_COUNTERS), st.integers(0, 2**32 - 1)),
                 min_size=1, max_size=40)


@given(steps)
@settings(max_examples=150, deadline=None)
def test_no_hw_counter_ever_drains_a_node_and_congestion_or_job_counters_never_even_warn(tmp_path_factory, moves):
    root = tmp_path_factory.mktemp("roce")
    build_tree(root, nics=1, link_layer="Ethernet")
    node, now = Node(root), T0
    for gap, name, value in moves:
        now += gap
        node.hw_counter(name).write_text(f"{value}\n")
        for finding in node.check(now):
            assert finding.kind == "roce-retransmits" and judge(finding).action is Action.WARN
            assert finding.detail.split()[1] not in NOT_JUDGED


@given(st.lists(st.floats(STEP, 120.0), min_size=1, max_size=30), st.floats(0.0, 1000.0))
@settings(max_examples=150, deadline=None)
def test_a_steady_retransmission_rate_is_read_as_that_rate_whatever_the_gaps(tmp_path_factory, gaps, per_minute):
    root = tmp_path_factory.mktemp("roce")
    build_tree(root, nics=1, link_layer="Ethernet")
    limits = CheckLimits(roce_seq_errors_per_min=0)  # every rate above 0 is reported, so its value can be read
    node, now = Node(root, limits), T0
    counter = node.hw_counter("packet_seq_err")
    node.check(now)
    start = now
    for gap in gaps:
        now += gap
        counter.write_text(f"{int((now - start) * per_minute / 60)}\n")
        for finding in node.check(now):
            rate = float(finding.detail.split()[2].removesuffix("/min"))
            assert rate <= per_minute + 60 / 30 + 0.05  # one count of rounding over the 30 s minimum span
