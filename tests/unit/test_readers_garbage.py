"""Every reader of user- or process-written input, fed generated garbage, either reads it or
raises a ClusterctlError (one clear line at the command line) — never another exception."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterctl.errors import ClusterctlError
from clusterctl.launcher.shared.runs import spec_from_document
from clusterctl.launcher.pure.spec import parse_spec
from clusterctl.records.rank_map import read_rank_map, rank_map_path
from clusterctl.records.run_journal import read_run_journal
from clusterctl.slurm import hostlist
from clusterctl.slurm.topology import parse_topology

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20)

spec_words = st.sampled_from(["[job]", "[launch]", "[parallel]", "[restart]", "[placement]", "[checkpoint]",
                              "name = 'x'", "nodes = 2", "nodes = -1", "nodes = 1e400", "gpus_per_node = 0",
                              "command = ['python', '{run_dri}']", "command = []", "tp = 3", "dp = 0",
                              "sbatch_options = ['-N2']", "exclude = 'n[1-'", "time = '25:99'", "switches = -1",
                              "webhook = 'ftp://x'", "poll_seconds = nan", "order = 'tp-tp'", "env = {A = 1}",
                              "weights = {zz = 1}", "x = [[[[[[1]]]]]]", "= =", "\x00", "\ufeff", "[[job]]"])


def reads_or_refuses(read, *args, **kwargs) -> None:
    try:
        read(*args, **kwargs)
    except ClusterctlError as exc:
        assert str(exc).strip(), "an error must say something"


@SETTINGS
@given(st.lists(spec_words, max_size=12).map("\n".join) | st.text(max_size=200))
def test_the_spec_reader_never_crashes(text: str) -> None:
    reads_or_refuses(parse_spec, text, "job.toml", base_dir=Path("/tmp"))


@SETTINGS
@given(json_values)
def test_spec_json_of_any_shape_is_read_or_refused(data: object) -> None:
    reads_or_refuses(spec_from_document, data, "spec.json")
    if isinstance(data, dict):
        reads_or_refuses(spec_from_document, {"kind": "run-spec", "version": 1, **data}, "spec.json")


topology_words = st.sampled_from(["SwitchName=s1", "SwitchName=s2", "Nodes=n[1-2]", "Nodes=n[1-", "Switches=s[1-2]",
                                  "Switches=s1", "Level=0", "LinkSpeed=1", "Foo=bar", "=", "spine.leaf.n1",
                                  "n1 spine.leaf.n1", "..", "#", "Nodes=n[٣]", "Nodes=a[1-60000]b[1-60000]"])


@SETTINGS
@given(st.lists(st.lists(topology_words, min_size=1, max_size=4).map(" ".join), max_size=8).map("\n".join)
       | st.text(max_size=200))
def test_the_topology_reader_never_crashes(text: str) -> None:
    reads_or_refuses(parse_topology, text, "topology.conf")


@SETTINGS
@given(st.text(alphabet=st.sampled_from(list("an01-9[],- ٣²x")), max_size=40) | st.text(max_size=40))
def test_hostlist_expansion_never_crashes(expression: str) -> None:
    reads_or_refuses(hostlist.expand, expression)


event_names = st.sampled_from(["created", "submitting", "submitted", "decided", "ended", "waiting", "ending",
                               "submit-lost", "done", "stopped", "cancelled", "nonsense"])


@st.composite
def journal_lines(draw) -> bytes:
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return draw(st.binary(max_size=60))
    if kind == 1:
        return json.dumps(draw(json_values)).encode()
    fields = draw(st.dictionaries(st.sampled_from(["attempt", "job_id", "at", "blame", "argv", "message", "state",
                                                   "outcome", "action", "comment", "times", "exclude", "name"]),
                                  json_values, max_size=6))
    return json.dumps({"kind": "run-event", "version": draw(st.integers(0, 2)), "event": draw(event_names),
                       "at": draw(st.floats() | st.integers()), **fields}).encode()


@SETTINGS
@given(st.lists(journal_lines(), max_size=6))
def test_the_run_journal_reader_never_crashes(lines: list[bytes]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "journal.jsonl"
        path.write_bytes(b"\n".join(lines))
        reads_or_refuses(read_run_journal, path)


@SETTINGS
@given(json_values | st.fixed_dictionaries({"kind": st.just("rank-map"), "version": st.just(1)}, optional={
    "job_id": json_values, "nodelist": json_values, "slots": json_values, "gpus_per_node": json_values,
    "master_port": json_values, "spares": json_values, "summary": json_values, "plan": json_values}))
def test_the_rank_map_reader_never_crashes(data: object) -> None:
    with tempfile.TemporaryDirectory() as directory:
        job_dir = Path(directory)
        rank_map_path(job_dir).write_text(json.dumps(data))
        reads_or_refuses(read_rank_map, job_dir)
