"""A checkpoint copy's manifest (multi-level checkpoints): it reads back as written, and anything a
reader does not exactly understand is a RecordError naming the file and the key, never a traceback."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterctl.records.checkpoint_manifest import (
    MAX_SHARDS, CheckpointManifest, Shard, read_checkpoint_manifest, shard_name_problem, write_checkpoint_manifest)
from clusterctl.records.versioned import RecordError

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SHA = "ab" * 32


def node3_copy_on(tier: str, held_on: str | None, *names: str) -> CheckpointManifest:
    return CheckpointManifest(step=40, of_node="node3", tier=tier, held_on=held_on,
                              shards=tuple(Shard(n, 1 << 30, SHA) for n in names or ("__0_0.distcp", ".metadata")),
                              written_at=1_700_000_000.5, save_seconds=12.25)


def test_a_manifest_written_after_the_shards_reads_back_the_same(tmp_path):
    for copy in (node3_copy_on("local", "node3"), node3_copy_on("buddy", "node1"), node3_copy_on("shared", None)):
        path = write_checkpoint_manifest(tmp_path / f"{copy.tier}.json", copy)
        assert read_checkpoint_manifest(path) == copy
        assert json.loads(path.read_text())["kind"] == "checkpoint-manifest"
    assert node3_copy_on("buddy", "node1").total_bytes == 2 << 30


def test_the_copy_is_named_in_a_users_words():
    assert node3_copy_on("local", "node3").where == "node3's local copy"
    assert node3_copy_on("buddy", "node1").where == "node3's copy on node1"
    assert node3_copy_on("shared", None).where == "node3's copy on shared storage"


def stored(**changes: object) -> dict:
    document = node3_copy_on("buddy", "node1").to_json()
    document.update(changes)
    return document


@pytest.mark.parametrize(("document", "says"), [
    (stored(version=2), "version 2 is newer"),
    (stored(compression="zstd"), "unknown field `compression`"),
    (stored(shards=[{"name": "a.distcp", "size": 1, "sha256": SHA, "owner": "x"}]), "shards[0]: unknown field `owner`"),
    (stored(shards=[{"name": "../../etc/passwd", "size": 1, "sha256": SHA}]), "shards[0]: field `name`"),
    (stored(shards=[{"name": "a/b/c", "size": 1, "sha256": SHA}]), "second '/'"),
    (stored(shards=[{"name": "/etc", "size": 1, "sha256": SHA}]), "leading"),
    (stored(slot=3, slots=3), "field `slot` is 3"),
    (stored(slots=-1), "field `slots`"),
    (stored(shards=[{"name": "a\x1b[2Jb", "size": 1, "sha256": SHA}]), "control"),
    (stored(shards=[{"name": "x" * 256, "size": 1, "sha256": SHA}]), "at most 255"),
    (stored(shards=[{"name": "a", "size": 1, "sha256": SHA}] * 2), "listed twice"),
    (stored(shards=[{"name": "a", "size": -1, "sha256": SHA}]), "field `size`"),
    (stored(shards=[{"name": "a", "size": 1, "sha256": "AB" * 32}]), "field `sha256`"),
    (stored(shards=[{"name": f"{i}.distcp", "size": 1, "sha256": SHA} for i in range(MAX_SHARDS + 1)]),
     f"at most {MAX_SHARDS}"),
    (stored(written_at=math.inf), "field `written_at`"),
    (stored(save_seconds=-1.0), "field `save_seconds`"),
    (stored(step=True), "field `step`"),
    (stored(tier="nvme"), "field `tier`"),
    (stored(held_on="node3"), "field `held_on`"),
    (stored(held_on=None), "field `held_on`"),
    (stored(tier="shared"), "field `held_on`"),
    (stored(of_node="--help"), "field `of_node`"),
    ({k: v for k, v in stored().items() if k != "shards"}, "missing field `shards`"),
])
def test_a_manifest_not_exactly_understood_is_refused_naming_the_file_and_the_key(tmp_path, document, says):
    path = tmp_path / "node3.json"
    path.write_text(json.dumps(document))
    with pytest.raises(RecordError, match=r"node3\.json") as refused:
        read_checkpoint_manifest(path)
    assert says in str(refused.value)


def test_a_manifest_that_is_a_symlink_or_not_json_is_refused(tmp_path):
    write_checkpoint_manifest(tmp_path / "real.json", node3_copy_on("local", "node3"))
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    (tmp_path / "torn.json").write_text('{"kind": "checkpoint-manifest", "vers')
    for name in ("link.json", "torn.json"):
        with pytest.raises(RecordError, match=name):
            read_checkpoint_manifest(tmp_path / name)
    with pytest.raises(FileNotFoundError):
        read_checkpoint_manifest(tmp_path / "never-written.json")


def test_shard_names_are_plain_file_names():
    for name in ("__0_0.distcp", ".metadata", "model_optim_rng.pt", "shard 7.distcp", "模型.pt",
                 "rank-3/__0_0.distcp", "rank-3/.metadata"):
        assert shard_name_problem(name) is None, name
    for name in ("", ".", "..", "../x", "a/b/c", "/a", "a/", "./a", "a/..", "x..y", "a\nb", "a\x00b", "a\u202eb",
                 "é" * 128):
        assert shard_name_problem(name) is not None, name


def test_a_manifest_that_contradicts_itself_cannot_be_built():
    with pytest.raises(ValueError, match="held on its own node"):
        node3_copy_on("local", "node1")
    with pytest.raises(ValueError, match="plain file name"):
        node3_copy_on("local", "node3", "../x")
    with pytest.raises(ValueError, match="listed twice"):
        node3_copy_on("shared", None, "a", "a")


node_names = st.sampled_from(["node1", "node3", "gpu-a17", "n0001"])
shard_names = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Cf", "Zl", "Zp", "Co", "Cn", "Zs")),
                      min_size=1, max_size=40).filter(lambda n: shard_name_problem(n) is None)
shards = st.builds(Shard, shard_names, st.integers(0, 2**63 - 1), st.text("0123456789abcdef", min_size=64, max_size=64))
seconds = st.floats(0, 4e9, allow_nan=False, allow_infinity=False)


@st.composite
def manifests(draw) -> CheckpointManifest:
    of_node = draw(node_names)
    tier = draw(st.sampled_from(["local", "buddy", "shared"]))
    held_on = of_node if tier == "local" else None if tier == "shared" else \
        draw(node_names.filter(lambda n: n != of_node))
    unique = draw(st.lists(shards, max_size=8, unique_by=lambda s: s.name))
    slots = draw(st.integers(1, 12_500))
    return CheckpointManifest(draw(st.integers(0, 2**63 - 1)), of_node, tier, held_on, tuple(unique),
                              draw(seconds), draw(seconds), draw(st.integers(0, slots - 1)), slots)


@SETTINGS
@given(manifests())
def test_every_manifest_reads_back_as_written(manifest):
    assert CheckpointManifest.from_json(json.loads(json.dumps(manifest.to_json())), "m.json") == manifest


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20)


def reads_or_refuses(document: object) -> None:
    try:
        CheckpointManifest.from_json(document, "garbage.json")
    except RecordError as exc:
        assert "garbage.json" in str(exc)


@SETTINGS
@given(json_values)
def test_garbage_is_a_record_error_never_another_exception(document):
    reads_or_refuses(document)
    if isinstance(document, dict):
        reads_or_refuses({"kind": "checkpoint-manifest", "version": 1, **document})


@SETTINGS
@given(manifests(), st.sampled_from(["step", "of_node", "held_on", "tier", "shards", "written_at", "save_seconds",
                                     "name", "size", "sha256", "extra"]), json_values)
def test_a_good_manifest_with_one_value_spoiled_is_read_or_refused_cleanly(manifest, key, value):
    document = manifest.to_json()
    if key in ("name", "size", "sha256", "extra"):
        document["shards"] = [{**s, key: value} for s in document["shards"]] or [{key: value}]
    else:
        document[key] = value
    reads_or_refuses(document)


@SETTINGS
@given(st.binary(max_size=200))
def test_any_bytes_in_a_manifest_file_are_read_or_refused(tmp_path_factory, raw):
    path = tmp_path_factory.mktemp("manifest") / "m.json"
    path.write_bytes(raw)
    try:
        read_checkpoint_manifest(path)
    except RecordError as exc:
        assert "m.json" in str(exc)
