"""What a rank reads of its job's map (`rankmap.idx`): its own slot and the job's shared facts,
a few hundred bytes whatever the job's size, and nothing it does not understand."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clusterctl.launcher.pure.preflight import node_problems, placement_problems, rank_environment, torchrun_argv
from clusterctl.records.rank_index import HEADER_MAX_BYTES, read_slot, rank_index_path, write_rank_index
from clusterctl.records.rank_map import JobRankMap, RankMap
from clusterctl.records.versioned import RecordError, indented_json

NAMES = st.text(st.sampled_from("abcgpu-_.0123456789é"), min_size=1, max_size=12)


@given(st.lists(NAMES, min_size=1, max_size=40, unique=True), st.sampled_from([1, 2, 4, 8]),
       st.integers(1024, 65535))
def test_every_rank_reads_back_the_slot_and_environment_the_whole_map_gives(slots, gpus_per_node, port):
    whole = JobRankMap("4242", "n[1-40]", RankMap(tuple(slots), gpus_per_node), port)
    with tempfile.TemporaryDirectory() as job_dir:
        write_rank_index(Path(job_dir), whole)
        for rank in range(whole.world_size):
            mine = read_slot(Path(job_dir), rank=rank)
            assert mine.location(rank) == whole.location(rank)
            assert rank_environment(mine, rank) == rank_environment(whole, rank)
            node, gpu = whole.location(rank)
            assert placement_problems(mine, rank, node, gpu, None) == []
        for node_rank, node in enumerate(slots):
            mine = read_slot(Path(job_dir), node_rank=node_rank)
            assert node_problems(mine, node_rank, node) == []
            assert torchrun_argv(mine, node_rank, "/py", job_dir, ["train"]) == \
                torchrun_argv(whole, node_rank, "/py", job_dir, ["train"])


def test_a_rank_on_the_wrong_host_is_caught_from_its_slot_alone(tmp_path):
    write_rank_index(tmp_path, JobRankMap("42", "node[1,3-4]", RankMap(("node3", "node1", "node4"), 8), 20042))
    assert placement_problems(read_slot(tmp_path, rank=9), 9, "node4", 1, None) == [
        "rank 9 runs on node4 but the rank map puts it on node1 (was srun given -w, or SLURM_HOSTFILE ignored?)"]
    assert node_problems(read_slot(tmp_path, node_rank=2), 2, "node3") == [
        "node rank 2 runs on node3 but the rank map puts it on node4"]


def test_a_rank_outside_the_map_is_caught(tmp_path):
    write_rank_index(tmp_path, JobRankMap("42", "node[1,3-4]", RankMap(("node3", "node1", "node4"), 8), 20042))
    assert placement_problems(read_slot(tmp_path, rank=24), 24, "node4", 0, None) == [
        "rank 24 is outside the map's 24 ranks"]
    assert node_problems(read_slot(tmp_path, node_rank=3), 3, "node4") == ["node rank 3 is outside the map's 3 nodes"]


def test_a_rank_reads_only_the_header_and_its_own_line(tmp_path):
    slots = tuple(f"gpu{i:05d}" for i in range(12_500))
    write_rank_index(tmp_path, JobRankMap("42", "gpu[00000-12499]", RankMap(slots, 8), 20042))
    path = rank_index_path(tmp_path)
    text = path.read_bytes()
    header_end = text.index(b"\n") + 1
    width = len(slots[0]) + 1
    mine = 6_000
    # Every other slot's line made unreadable: the rank never looks at them.
    damaged = bytearray(b"\xff" * len(text))
    damaged[:header_end] = text[:header_end]
    damaged[header_end + mine * width: header_end + (mine + 1) * width] = \
        text[header_end + mine * width: header_end + (mine + 1) * width]
    path.write_bytes(bytes(damaged))
    assert read_slot(tmp_path, rank=mine * 8 + 5).location(mine * 8 + 5) == ("gpu06000", 5)
    assert header_end <= HEADER_MAX_BYTES and len(text) > 100_000


def test_the_index_is_text_a_person_can_read(tmp_path):
    write_rank_index(tmp_path, JobRankMap("42", "node[1,3,12]", RankMap(("node3", "node12", "node1"), 8), 20042))
    header, *lines = rank_index_path(tmp_path).read_text().splitlines()
    assert json.loads(header) == {"kind": "rank-map-index", "version": 1, "job_id": "42", "gpus_per_node": 8,
                                  "nodes": 3, "master_addr": "node3", "master_port": 20042, "record_bytes": 7}
    assert [line.rstrip() for line in lines] == ["node3", "node12", "node1"]


def test_an_index_from_a_newer_clusterctl_is_refused(tmp_path):
    write_rank_index(tmp_path, JobRankMap("42", "node[1-3]", RankMap(("node3", "node1"), 8), 20042))
    path = rank_index_path(tmp_path)
    header, rest = path.read_text().split("\n", 1)
    path.write_text(json.dumps({**json.loads(header), "version": 2}) + "\n" + rest)
    with pytest.raises(RecordError, match="rank-map-index record version 2 is newer than this clusterctl understands"):
        read_slot(tmp_path, rank=0)


def test_a_cut_short_index_is_refused_not_misread(tmp_path):
    write_rank_index(tmp_path, JobRankMap("42", "node[1-3]", RankMap(("node3", "node1", "node2"), 8), 20042))
    path = rank_index_path(tmp_path)
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(RecordError, match="the file is damaged or half-copied"):
        read_slot(tmp_path, rank=0)


def test_something_else_in_its_place_is_refused(tmp_path):
    rank_index_path(tmp_path).write_text('{"kind": "rank-map", "version": 1}\nnode1\n')
    with pytest.raises(RecordError, match="not a rank-map-index record"):
        read_slot(tmp_path, rank=0)
    rank_index_path(tmp_path).write_bytes(b"x" * (HEADER_MAX_BYTES + 10))
    with pytest.raises(RecordError, match="no header line"):
        read_slot(tmp_path, rank=0)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=60)


@given(JSON)
def test_big_records_are_written_exactly_as_json_dumps_writes_them(document):
    assert indented_json(document) == json.dumps(document, indent=2, sort_keys=True)


def test_a_rank_map_of_a_100000_node_job_is_the_same_text_in_pieces():
    document = {"slots": [f"gpu{i:06d}" for i in range(100_000)], "plan": {"nodes": [{"slot": i} for i in range(5)]}}
    assert indented_json(document) == json.dumps(document, indent=2, sort_keys=True)
