"""One node's checkpoint copy on disk, checked against its manifest: a node's large rank files are
checked side by side and the first bad one in the manifest's order is named; a copy made from
another tier is checked in the same pass that copies it; and what a transport measured while it
wrote a copy is enough to trust it, or to refuse it."""

from __future__ import annotations

import os
from pathlib import Path

from clusterctl.checkpoint.copies import ReceivedCopy, copy_verified, link_shards, shards_of, verify_copy
from clusterctl.records.checkpoint_manifest import CheckpointManifest, Shard

MIB = 1 << 20


def node_copy(folder: Path, ranks: int, size: int) -> CheckpointManifest:
    """A node's copy: each rank's own folder with a large shard and DCP's small .metadata."""
    for rank in range(ranks):
        (folder / f"rank-{rank}").mkdir(parents=True)
        (folder / f"rank-{rank}" / "__0_0.distcp").write_bytes(os.urandom(size))
        (folder / f"rank-{rank}" / ".metadata").write_bytes(f"rank {rank}".encode())
    return CheckpointManifest(step=7, of_node="node1", tier="local", held_on="node1", shards=shards_of(folder),
                              written_at=1.0, save_seconds=0.1, slot=0, slots=2)


def flip_a_byte(path: Path, at: int) -> None:
    with path.open("r+b") as file:
        file.seek(at)
        byte = file.read(1)
        file.seek(at)
        file.write(bytes([byte[0] ^ 0x01]))


def test_a_node_of_four_ranks_is_verified_side_by_side_and_the_first_bad_shard_is_named(tmp_path: Path) -> None:
    copy = tmp_path / "step"
    manifest = node_copy(copy, ranks=4, size=20 * MIB)
    assert verify_copy(copy, manifest) == ""
    flip_a_byte(copy / "rank-3" / "__0_0.distcp", 5 * MIB)
    flip_a_byte(copy / "rank-1" / "__0_0.distcp", 19 * MIB)
    assert verify_copy(copy, manifest) == "fails its checksum (shard rank-1/__0_0.distcp)"
    os.truncate(copy / "rank-2" / ".metadata", 1)  # a wrong size is found before any byte is hashed
    assert verify_copy(copy, manifest) == "has shard rank-2/.metadata of 1 bytes, not 6 (truncated?)"


def test_a_copy_from_another_tier_is_checked_as_it_is_copied(tmp_path: Path) -> None:
    source = tmp_path / "shared"
    manifest = node_copy(source, ranks=2, size=3 * MIB)
    assert copy_verified(source, tmp_path / "staged", manifest) == ""
    assert verify_copy(tmp_path / "staged", manifest) == ""

    flip_a_byte(source / "rank-0" / "__0_0.distcp", 1)
    taken: list[int] = []
    problem = copy_verified(source, tmp_path / "again", manifest, take=taken.append)
    assert problem == "fails its checksum (shard rank-0/__0_0.distcp)"
    assert sum(taken) == 6 + 3 * MIB, "read up to the bad shard (in the manifest's order), no further"


def test_a_copy_the_node_holds_already_is_staged_by_linking_and_then_checked(tmp_path: Path) -> None:
    kept = tmp_path / "buddy"
    manifest = node_copy(kept, ranks=2, size=MIB)
    link_shards(kept, tmp_path / "staged", [s.name for s in manifest.shards])
    assert verify_copy(tmp_path / "staged", manifest) == ""
    for shard in manifest.shards:
        assert os.stat(tmp_path / "staged" / shard.name).st_ino == os.stat(kept / shard.name).st_ino


def test_what_a_transport_measured_proves_a_copy_or_names_what_differs() -> None:
    listed = (Shard("rank-0/__0_0.distcp", 10, "ab" * 32), Shard("rank-0/.metadata", 2, "cd" * 32))
    manifest = CheckpointManifest(step=7, of_node="node1", tier="buddy", held_on="node2", shards=listed,
                                  written_at=1.0, save_seconds=0.1)
    assert ReceivedCopy(manifest, listed).problem() == ""
    assert ReceivedCopy(manifest, (listed[0], Shard("rank-0/.metadata", 2, "ef" * 32))).problem() == \
        "fails its checksum (shard rank-0/.metadata)"
    assert ReceivedCopy(manifest, (listed[0], Shard("rank-0/.metadata", 1, "cd" * 32))).problem() == \
        "has shard rank-0/.metadata of 1 bytes, not 2 (truncated?)"
    assert ReceivedCopy(manifest, listed[:1]).problem() == \
        "is missing shard rank-0/.metadata (the transport did not check it)"
