"""Bad input of every class the issue-18 probe found ends in one clear ClusterctlError, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterctl.errors import TopologyError
from clusterctl.slurm.topology import load_nvlink_domains, load_topology, parse_topology_conf


def test_a_topology_file_that_is_not_utf8_is_a_topology_error(tmp_path: Path) -> None:
    path = tmp_path / "topology.conf"
    path.write_bytes(b"SwitchName=s1 Nodes=n\xff[1-2]\n")
    with pytest.raises(TopologyError, match="not UTF-8"):
        load_topology(path)


def test_an_nvlink_domain_file_that_is_not_utf8_is_a_topology_error(tmp_path: Path) -> None:
    path = tmp_path / "nvl.toml"
    path.write_bytes(b'[[domain]]\nname = "r\xff"\nnodes = "n[1-2]"\n')
    with pytest.raises(TopologyError, match="not UTF-8"):
        load_nvlink_domains(path)


def test_a_deeply_nested_nvlink_domain_file_is_a_topology_error(tmp_path: Path) -> None:
    path = tmp_path / "nvl.toml"
    path.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(TopologyError, match="nested too deeply"):
        load_nvlink_domains(path)


def test_a_very_deep_switch_chain_is_refused_with_its_line() -> None:
    lines = ["SwitchName=s0 Nodes=n[1-2]"] + [f"SwitchName=s{i} Switches=s{i - 1}" for i in range(1, 5000)]
    with pytest.raises(TopologyError, match="more than 64 levels"):
        parse_topology_conf("\n".join(lines))


def test_a_deep_but_allowed_chain_walks_without_recursion() -> None:
    lines = ["SwitchName=s0 Nodes=n[1-2]"] + [f"SwitchName=s{i} Switches=s{i - 1}" for i in range(1, 60)]
    assert parse_topology_conf("\n".join(lines)).dfs_order() == ["n1", "n2"]
