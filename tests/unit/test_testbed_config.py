"""The testbed's Slurm configuration, rendered from a Layout, against golden files."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterctl_testbed import slurm_config
from clusterctl_testbed.layout import Layout
from tests.golden import assert_golden

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "golden" / "testbed"
LAYOUT = Layout(root=Path("/tmp/ctb"))
HOOKS = slurm_config.Hooks(Path("/opt/cc/bin/clusterctl-prolog"), Path("/opt/cc/bin/clusterctl-epilog"),
                           Path("/opt/cc/bin/clusterctl-healthcheck"))

RENDERED = {
    "slurm.conf": slurm_config.slurm_conf(LAYOUT, HOOKS),
    "topology.conf": slurm_config.topology_conf(LAYOUT),
    "gres.conf": slurm_config.gres_conf(LAYOUT),
    "slurmdbd.conf": slurm_config.slurmdbd_conf(LAYOUT),
    "hosts": slurm_config.hosts_file(LAYOUT),
}


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_rendered_config_matches_golden(name):
    assert_golden(f"testbed/{name}", RENDERED[name])


def test_hooks_and_their_flags_are_wired():
    conf = RENDERED["slurm.conf"].splitlines()
    assert "Prolog=/opt/cc/bin/clusterctl-prolog" in conf
    assert "Epilog=/opt/cc/bin/clusterctl-epilog" in conf
    assert "PrologFlags=Alloc" in conf
    assert "HealthCheckProgram=/opt/cc/bin/clusterctl-healthcheck" in conf


def test_a_larger_layout_gets_ranges_and_one_line_per_leaf():
    layout = Layout(leaves=(("l1", ("node1", "node2", "node3")), ("l2", ("node4",)), ("l3", ("gpu-a", "gpu-b"))))
    topo = slurm_config.topology_conf(layout).splitlines()
    assert topo[1:] == ["SwitchName=l1 Nodes=node[1-3]", "SwitchName=l2 Nodes=node4",
                        "SwitchName=l3 Nodes=gpu-a,gpu-b", "SwitchName=spine Switches=l1,l2,l3"]
    assert layout.address("node4") == "10.77.0.14"
    assert layout.leaf_of("gpu-b") == "l3"


def test_socket_paths_fit_the_unix_limit():
    assert len(str(LAYOUT.munge_socket)) < 108
    assert len(str(LAYOUT.mysql_socket)) < 108
