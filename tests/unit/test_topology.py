"""Topology from topology.conf, `scontrol show topology` and SLURM_TOPOLOGY_ADDR: one tree, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clusterctl.errors import TopologyError
from clusterctl.slurm.topology import (
    load_nvlink_domains, load_topology, parse_scontrol_topology, parse_topology, parse_topology_addrs,
    parse_topology_conf,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"


def shape(topology):
    return topology.parent, topology.leaf_of


def test_three_views_of_the_testbed_give_the_same_tree():
    # All three recorded from the testbed's real Slurm.
    conf = load_topology(DATA / "topology.conf")
    shown = load_topology(DATA / "scontrol-show-topology.txt")
    addrs = load_topology(DATA / "topology-addr.txt")
    assert shape(conf) == shape(shown) == shape(addrs)
    assert conf.leaf_of == {"node1": "leaf1", "node2": "leaf1", "node3": "leaf2", "node4": "leaf2"}
    assert conf.parent == {"leaf1": "spine", "leaf2": "spine", "spine": None}
    assert conf.level_names() == ["nvlink", "leaf", "spine"]


def test_three_levels_and_dfs_order():
    topo = parse_topology_conf("""
        # comments and blank lines are fine
        SwitchName=l1 Nodes=a[1-2]
        SwitchName=l2 Nodes=a[3-4]
        SwitchName=l3 Nodes=b1
        SwitchName=agg1 Switches=l[1-2]
        SwitchName=agg2 Switches=l3
        switchname=core switches=agg[1-2] linkspeed=100
    """)
    assert topo.switch_path("a3") == ["l2", "agg1", "core"]
    assert topo.level_names() == ["nvlink", "leaf", "agg", "spine"]
    assert topo.dfs_order(["b1", "a4", "a1"]) == ["a1", "a4", "b1"]
    assert [topo.unit("b1", level) for level in range(4)] == ["b1", "l3", "agg2", "core"]


def test_addr_paths_accept_bare_paths():
    topo = parse_topology_addrs("s.l1.n1\ns.l1.n2\ns.l2.n3\n")
    assert topo.leaf_of == {"n1": "l1", "n2": "l1", "n3": "l2"}


@pytest.mark.parametrize("text, message", [
    ("SwitchName=l1 Nodes=n[1-2]\nSwitchName=s Switches=l1,l9\n", "topology.conf:2: switch 's' lists unknown switch 'l9'"),
    ("SwitchName=l1 Nodes=n[1-2]\nSwitchName=l2 Nodes=n2\n", "topology.conf:2: node 'n2' is under two leaf switches"),
    ("SwitchName=a Switches=b\nSwitchName=b Switches=a\nSwitchName=l Nodes=n1\n", "switches form a cycle"),
    ("SwitchName=l1 Nodes=n1\nSwitchName=l1 Nodes=n2\n", "topology.conf:2: switch 'l1' is defined twice"),
    ("SwitchName=l1 Nodes=n[1-\n", "topology.conf:1: Nodes: hostlist 'n[1-'"),
    ("SwitchName=l1 Nodes n1\n", "topology.conf:1: expected Key=Value, found 'Nodes'"),
    ("SwitchName=l1 Nodez=n1\n", "topology.conf:1: unknown key 'nodez'"),
    ("Nodes=n1\n", "topology.conf:1: every line needs SwitchName="),
])
def test_bad_topologies_name_file_and_line(text, message):
    with pytest.raises(TopologyError) as info:
        parse_topology_conf(text)
    assert message in str(info.value)


def test_bad_address_lines():
    with pytest.raises(TopologyError, match="SLURM_TOPOLOGY_ADDR:2: path 'n2' needs at least a switch"):
        parse_topology_addrs("s.l1.n1\nn2\n")
    with pytest.raises(TopologyError, match="names 2 switches"):
        parse_topology_addrs("s.l[1-2].n1\n")


def test_nvlink_domains(tmp_path):
    path = tmp_path / "nvl.toml"
    path.write_text('[[domain]]\nname = "rack1"\nnodes = "node[1-2]"\n')
    topo = load_topology(DATA / "topology.conf").with_nvlink_domains(load_nvlink_domains(path))
    assert topo.unit("node2", 0) == "rack1" and topo.unit("node3", 0) == "node3"
    path.write_text('[[domain]]\nname = "r"\nnodes = "node[1-2]"\n[[domain]]\nname = "q"\nnodes = "node2"\n')
    with pytest.raises(TopologyError, match="node 'node2' is in two NVLink domains"):
        load_nvlink_domains(path)
    path.write_text('[[domain]]\nname = "r"\nnodes = "gpu9"\n')
    with pytest.raises(TopologyError, match="not in the topology: gpu9"):
        topo.with_nvlink_domains(load_nvlink_domains(path))


def test_unreadable_file_is_a_topology_error(tmp_path):
    with pytest.raises(TopologyError, match="cannot read"):
        load_topology(tmp_path / "missing.conf")


def test_scontrol_upper_levels_do_not_place_nodes():
    topo = parse_scontrol_topology((DATA / "scontrol-show-topology.txt").read_text())
    assert set(topo.leaf_of.values()) == {"leaf1", "leaf2"}


# ---- topology/block (23.11+): blocks are leaves, aggregated blocks the units above them ----
SHOWN_2411 = """\
BlockName=b1 BlockIndex=0 Nodes=node[1-2] BlockSize=2
BlockName=b2 BlockIndex=1 Nodes=node[3-4] BlockSize=2
AggregatedBlock=b[1-2] BlockIndex=2 Nodes=node[1-4] BlockSize=4
"""
CONF = "BlockName=b1 Nodes=node[1-2]\nBlockName=b2 Nodes=node[3-4]\nBlockSizes=2,4\n"


def test_a_block_topology_reads_the_same_from_slurm_and_from_topology_conf():
    shown = parse_scontrol_topology(SHOWN_2411)
    conf = parse_topology_conf(CONF)
    assert shape(shown) == shape(conf) == ({"b1": "b[1-2]", "b2": "b[1-2]", "b[1-2]": None},
                                           {"node1": "b1", "node2": "b1", "node3": "b2", "node4": "b2"})
    assert shown.kind == conf.kind == "block" and shown.block_size == conf.block_size == 2
    assert shown.level_names() == ["nvlink", "block", "agg-block"]
    assert parse_topology(SHOWN_2411, "somewhere").leaf_of == shown.leaf_of  # recognised by content


def test_before_2411_blocks_have_no_size_or_aggregates_and_the_first_blocks_nodes_are_its_size():
    shown = parse_scontrol_topology("BlockName=b1 BlockIndex=0 Nodes=node[1-4]\nBlockName=b2 BlockIndex=1\n")
    assert shown.leaf_of == {f"node{i}": "b1" for i in range(1, 5)} and shown.block_size == 4
    assert shown.parent == {"b1": None}  # an empty block places nothing


@pytest.mark.parametrize(("text", "message"), [
    ("BlockName=b1 Nodes=node[1-2]\nBlockName=b2 Nodes=node2\n", r":2: node 'node2' is in two blocks"),
    ("BlockName=b1 Nodes=node1 Speed=3\n", r":1: unknown key 'speed' in a block topology"),
    ("BlockName=b1 Nodes=node1\nBlockSizes=two\n", r":2: BlockSizes='two'"),
    ("BlockName=b1\n", "no BlockName= line lists any node"),
    ("BlockName=b1 Nodes=node1\nAggregatedBlock=x Nodes=node[1-2]\n", r"lists nodes in no block: node2"),
])
def test_bad_block_topologies_name_the_line(text, message):
    with pytest.raises(TopologyError, match=message):
        parse_topology_conf(text)


block_words = st.sampled_from(["BlockName=b1", "BlockName=b2", "AggregatedBlock=b[1-2]", "BlockIndex=0", "Nodes=node[1-2]",
                               "Nodes=node[3-4]", "Nodes=node[1-4]", "Nodes=node[", "BlockSize=2", "BlockSize=x",
                               "BlockSizes=2,4", "BlockSizes=0", "Level=0", "SwitchName=s1", "=", "junk"])
block_text = st.lists(st.lists(block_words, min_size=1, max_size=5).map(" ".join), max_size=6).map("\n".join)


@given(block_text)
def test_any_block_like_text_reads_as_a_topology_or_a_topology_error(text):
    try:
        topology = parse_scontrol_topology(text)
    except TopologyError as exc:
        assert exc.exit_code == 4
    else:
        for node in topology.nodes:  # every node reaches the top through known units
            assert topology.units(node)[1] == topology.leaf_of[node]
        if topology.kind == "block":
            assert topology.block_size and topology.block_size > 0
