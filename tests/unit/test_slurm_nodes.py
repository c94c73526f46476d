"""Nodes from every Slurm release's JSON read the same; what cannot be read is a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clusterctl.errors import SlurmCommandError
from clusterctl.slurm.commands import Completed, Slurm
from clusterctl.slurm.jobs import FAMILY_38
from clusterctl.slurm.nodes import BASE_STATES, NodeState, SlurmNode, parse_nodes_json
from clusterctl.slurm.version import SlurmVersion, SlurmVersionError

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
OLD, MID, NEW = SlurmVersion(22, 5, 8), SlurmVersion(24, 11, 5), SlurmVersion(26, 5, 5)


# ---- the three shapes, as each release prints them (field names per SchedMD's data_parser) ----
def flat_2205(nodes: list[NodeState]) -> str:
    """22.05's `sinfo --json`: flat nodes, state a string plus state_flags."""
    return json.dumps({"meta": {"Slurm": {"release": "22.05.8"}}, "errors": [], "nodes": [
        {"name": n.name, "hostname": n.name, "state": n.state, "state_flags": list(n.flags), "reason": n.reason,
         "partitions": list(n.partitions)} for n in nodes]})


def scontrol_json_2302(nodes: list[NodeState]) -> str:
    """23.02's `scontrol show node --json` (v0.0.39): as 23.11+'s, its format named in `meta.plugins`."""
    return json.dumps({"meta": {"plugins": {"data_parser": "data_parser/v0.0.39"}, "Slurm": {"release": "23.02.8"}},
                       "nodes": [{"name": n.name, "hostname": n.name, "state": [n.state.upper(), *n.flags],
                                  "reason": n.reason, "partitions": list(n.partitions)} for n in nodes]})


def scontrol_json(nodes: list[NodeState]) -> str:
    """23.11+'s `scontrol show node --json`: state one list, base state first."""
    return json.dumps({"meta": {"slurm": {"release": "24.11.5"}}, "nodes": [
        {"name": n.name, "state": [n.state.upper(), *n.flags], "reason": n.reason, "partitions": list(n.partitions)}
        for n in nodes]})


def sinfo_per_node(nodes: list[NodeState]) -> str:
    """23.02+'s `sinfo --json -N`: one group per node and partition."""
    return json.dumps({"meta": {"slurm": {"release": "26.05.5"}}, "sinfo": [
        {"node": {"state": [n.state.upper(), *n.flags]}, "nodes": {"nodes": [n.name], "total": 1},
         "reason": {"description": n.reason, "time": 0, "user": ""}, "partition": {"name": partition}}
        for n in nodes for partition in n.partitions]})


def node(name: str, reason: str = "", state: str = "idle", partitions: tuple[str, ...] = ("gpu",)) -> NodeState:
    return NodeState(name, state, ("DRAIN",) if reason else (), reason, partitions)


CLUSTER = [node("node1", state="mixed"), node("node2", "admin: bad fan"),
           node("node3", "healthd: xid 79 gpu3 (GPU-1) drain-reset 2026-11-22T03:00:00Z"),
           node("node4", state="down", partitions=("gpu", "debug"))]


@pytest.mark.parametrize("render", [flat_2205, scontrol_json_2302, scontrol_json, sinfo_per_node])
def test_every_release_shape_reads_the_same_nodes(render):
    nodes = {n.name: n for n in parse_nodes_json(render(CLUSTER))}
    assert nodes["node2"].drained_by_someone_else and not nodes["node2"].drained_by_us
    assert nodes["node3"].drained_by_us
    assert not nodes["node1"].draining and nodes["node1"].state == "mixed"
    assert nodes["node4"].partitions == ("gpu", "debug")  # listed once, with both partitions


def test_recorded_2205_sinfo_tells_an_admin_drain_from_healthds():
    admin = {n.name: n for n in parse_nodes_json((DATA / "sinfo-json-admin-drain.json").read_text())}
    assert admin["node2"].drained_by_someone_else and admin["node1"].partitions == ("gpu",)
    ours = {n.name: n for n in parse_nodes_json((DATA / "sinfo-json-healthd-drain.json").read_text())}
    assert ours["node3"].drained_by_us and ours["node2"].flags == ("NOT_RESPONDING",)


def test_a_group_of_drained_nodes_is_refused_not_read_with_the_first_ones_reason():
    # 24.11's plain `sinfo --json`: an admin's drain and healthd's share one group and one reason.
    grouped = json.dumps({"meta": {"slurm": {"release": "24.11.5"}}, "sinfo": [
        {"node": {"state": ["IDLE", "DRAIN"]}, "nodes": {"nodes": ["node2", "node3"]},
         "reason": {"description": "admin: maintenance"}, "partition": {"name": "gpu"}},
        {"node": {"state": ["IDLE"]}, "nodes": {"nodes": ["node1", "node4"]}, "reason": {"description": ""},
         "partition": {"name": "gpu"}}]})
    with pytest.raises(SlurmVersionError, match=r"Slurm 24\.11\.5: field `sinfo\[0\]\.reason` covers 2 nodes "
                                                r"\(node\[2-3\]\).*sinfo --json -N"):
        parse_nodes_json(grouped)
    idle_only = json.loads(grouped)
    del idle_only["sinfo"][0]
    assert [n.name for n in parse_nodes_json(json.dumps(idle_only))] == ["node1", "node4"]


@pytest.mark.parametrize(("text", "field"), [
    ('{"nodes": [{"name": "n1", "state": ["DRAIN"]}]}', r"nodes\[0\]\.state"),
    ('{"nodes": [{"name": "n1", "state": {"current": "IDLE"}}]}', r"nodes\[0\]\.state"),
    ('{"nodes": [{"state": "idle"}]}', r"nodes\[0\]\.name"),
    ('{"sinfo": [{"node": {"state": "IDLE"}, "nodes": {"nodes": 3}}]}', r"sinfo\[0\]\.nodes\.nodes"),
    ('{"jobs": []}', "`nodes` is missing"),
    ("slurm_load_node error: Unable to contact slurm controller", "not JSON"),
])
def test_an_unknown_shape_names_release_command_and_field(text, field):
    with pytest.raises(SlurmVersionError, match=field) as caught:
        parse_nodes_json(text, ["scontrol", "show", "node", "--json"], MID)
    assert str(caught.value).startswith("`scontrol show node --json`: Slurm 24.11.5: ")
    assert caught.value.exit_code == 8


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                               st.sampled_from(["nodes", "sinfo", "name", "state", "state_flags", "reason", "node",
                                                "partitions", "partition", "description", "meta"]), inner, max_size=5),
                           max_leaves=20)


@given(json_values)
def test_any_json_reads_as_nodes_or_a_slurm_error_never_a_traceback(value):
    try:
        nodes = parse_nodes_json(json.dumps(value))
    except SlurmVersionError as exc:
        assert exc.exit_code == 8 and "`sinfo --json`" in str(exc)
    else:
        assert all(isinstance(n, NodeState) and n.state for n in nodes)


names = st.from_regex(r"node[0-9]{1,3}", fullmatch=True)
flag_sets = st.lists(st.sampled_from(["DRAIN", "NOT_RESPONDING", "COMPLETING", "MAINTENANCE", "FAIL"]),
                     unique=True, max_size=3).map(tuple)
states = st.builds(NodeState, names, st.sampled_from(sorted(BASE_STATES)).map(str.lower), flag_sets,
                   st.text(st.characters(blacklist_categories=("Cs",)), max_size=30),
                   st.lists(st.sampled_from(["gpu", "debug", "cpu"]), min_size=1, unique=True, max_size=3).map(tuple))


@given(st.lists(states, max_size=6, unique_by=lambda n: n.name))
def test_each_shape_gives_back_exactly_the_nodes_slurm_described(nodes):
    for render in (flat_2205, scontrol_json_2302, scontrol_json, sinfo_per_node):
        assert parse_nodes_json(render(nodes)) == nodes


def replay(answers: dict[str, str], calls: list[list[str]]):
    def runner(argv, timeout):
        calls.append(list(argv))
        return Completed(0, answers[argv[0] if argv[0] != "scontrol" else " ".join(argv[:3])], "")
    return runner


def test_healthd_reads_its_node_with_one_single_node_query_the_same_on_every_release():
    for version, release in (("slurm-wlm 22.05.8\n", OLD), ("slurm 24.11.5\n", MID)):
        calls: list[list[str]] = []
        slurm = SlurmNode("node3", replay({"sbatch": version, "sinfo": "node3|drained|gpu*|healthd: xid 79 gpu0 | x\n"
                                                                        "node3|drained|debug|healthd: xid 79 gpu0 | x\n"},
                                          calls))
        node = slurm.state()
        assert node.drained_by_us and node.reason == "healthd: xid 79 gpu0 | x" and node.partitions == ("gpu", "debug")
        assert calls == [["sinfo", "-h", "-n", "node3", "-o", "%N|%T|%P|%E"]]  # no `sbatch --version` first
        assert slurm.release() == release


def test_the_breaker_counts_a_partition_from_one_grouped_sinfo():
    calls: list[list[str]] = []
    text = ("2|drained|healthd: ecc-dbe gpu0 drain-reset 2026-11-22T00:00:00Z\n1|draining|admin: fan\n"
            "1|drained*|healthd: xid 79 gpu1 drain-reboot 2026-11-22T00:00:00Z\n96|idle|none\n")
    share = SlurmNode("node3", replay({"sinfo": text}, calls), release=OLD).partition_share("gpu")
    assert (share.nodes, share.drained_by_us) == (100, 3)
    assert calls == [["sinfo", "-h", "-p", "gpu", "-o", "%D|%T|%E"]]


def test_a_node_slurm_does_not_know_is_an_error_naming_it():
    slurm = SlurmNode("node9", replay({"sinfo": ""}, []), release=MID)
    with pytest.raises(SlurmCommandError, match="node node9 not known to Slurm"):
        slurm.state()


def test_an_answer_about_another_node_or_of_another_shape_is_a_clear_error():
    for text in ("node4|idle|gpu|none\n", "{}\n", "node9|dra1ned|gpu|none\n"):
        with pytest.raises(SlurmVersionError, match="sinfo -h -n node9"):
            SlurmNode("node9", replay({"sinfo": text}, []), release=MID).state()
    with pytest.raises(SlurmVersionError, match="expected COUNT"):
        SlurmNode("node9", replay({"sinfo": "many|idle|none\n"}, []), release=MID).partition_share("gpu")


# ---- real outputs recorded from each release's testbed (tests/recordings.py: every recorded release) ----
def test_on_every_recorded_release_healthd_tells_an_admin_drain_from_its_own(recording):
    runner = recording.replay()
    state = {name: SlurmNode(name, runner).state() for name in ("node1", "node2", "node3", "node4")}
    assert state["node2"].drained_by_someone_else and state["node2"].reason == "admin: maintenance"
    assert state["node3"].drained_by_us and state["node3"].reason.startswith("healthd: xid 79 gpu0")
    assert not state["node1"].draining and state["node1"].state in ("allocated", "mixed")
    assert state["node4"].state == "down"
    share = SlurmNode("node1", runner).partition_share("gpu")
    assert (share.nodes, share.drained_by_us) == (4, 1)
    assert SlurmNode("node1", runner).partition_size("gpu") == 4
    assert ["sbatch", "--version"] not in runner.calls  # the same commands on every release


def test_on_every_recorded_release_the_supervisors_node_view_has_each_nodes_own_reason(recording):
    nodes = {n.name: n for n in parse_nodes_json(Slurm(recording.replay()).nodes_json())}
    assert nodes["node3"].drained_by_us and nodes["node2"].drained_by_someone_else


def test_on_every_recorded_release_a_dead_node_reads_as_not_responding_by_either_query(recording):
    single = SlurmNode("node4", recording.replay()).state()
    table = {n.name: n for n in parse_nodes_json(Slurm(recording.replay()).nodes_json())}["node4"]
    assert (single.state, single.flags) == ("down", ("NOT_RESPONDING",))
    assert table.state == "down" and "NOT_RESPONDING" in table.flags
    assert "NOT_RESPONDING" not in SlurmNode("node1", recording.replay()).state().flags


def test_sinfo_state_suffixes_read_as_the_flags_json_names():
    answers = {"mixed*": ("mixed", ("NOT_RESPONDING",)), "idle~": ("idle", ("POWERED_DOWN",)),
               "drained*": ("drained", ("DRAIN", "NOT_RESPONDING")), "mixed+drain$": ("mixed", ("DRAIN", "MAINTENANCE")),
               "idle": ("idle", ())}
    for text, expected in answers.items():
        state = SlurmNode("node9", replay({"sinfo": f"node9|{text}|gpu|none\n"}, []), release=MID).state()
        assert (state.state, state.flags) == expected, text


def test_plain_sinfo_json_is_read_where_nodes_are_flat_and_refused_where_it_groups_two_drains(recording):
    text = recording.text("sinfo.json")
    if recording.version.json_family == FAMILY_38:  # one entry per node, each with its own reason
        assert {n.name for n in parse_nodes_json(text) if n.drained_by_us} == {"node3"}
    else:
        with pytest.raises(SlurmVersionError, match="only the first one's"):
            parse_nodes_json(text)
