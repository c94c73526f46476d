"""Moving a node's checkpoint copy to its buddy and back over TCP: only the job's key opens the door,
only a copy whose every shard verifies is ever kept under its final name, and every failure is one
TransferError that says what failed, with which node."""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterctl.checkpoint.copies import MANIFEST_NAME, shards_of
from clusterctl.checkpoint.transport import (
    CHUNK, MAGIC, NONCE_BYTES, REQUEST_LABEL, CopyRequest, CopyServer, TransferError, copy_dir_name, fetch_copy,
    parse_copy_request, push_copy)
from clusterctl.records.checkpoint_manifest import (
    CheckpointManifest, Shard, read_checkpoint_manifest, write_checkpoint_manifest)

KEY = bytes(range(32))
OTHER_JOBS_KEY = bytes(32)
SHORT = 10.0


def node3_saves_step_40(tier_root: Path) -> tuple[Path, CheckpointManifest]:
    """node3's local copy of step 40: a rank's folder, a file larger than one network read, an empty file."""
    copy = tier_root / "local" / copy_dir_name(40)
    (copy / "rank-3").mkdir(parents=True)
    (copy / "rank-3" / "__0_0.distcp").write_bytes(os.urandom(2 * CHUNK) + b"tail")
    (copy / ".metadata").write_bytes(b'{"step": 40}')
    (copy / "empty.bin").write_bytes(b"")
    manifest = CheckpointManifest(step=40, of_node="node3", tier="local", held_on="node3", shards=shards_of(copy),
                                  written_at=1_700_000_000.0, save_seconds=1.5, slot=3, slots=4)
    write_checkpoint_manifest(copy / MANIFEST_NAME, manifest)
    return copy, manifest


def files_in(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != MANIFEST_NAME}


def test_a_copy_pushed_to_its_buddy_is_fetched_back_bit_identical_through_two_nodes(tmp_path):
    copy, manifest = node3_saves_step_40(tmp_path / "node3")
    received: list[CheckpointManifest] = []
    with CopyServer(tmp_path / "node1", "node1", KEY, 0, "127.0.0.1", on_received=received.append) as node1, \
            CopyServer(tmp_path / "node2", "node2", KEY, 0, "127.0.0.1") as node2:
        push_copy("127.0.0.1", node1.port, KEY, copy, manifest, timeout=SHORT)

        kept = tmp_path / "node1" / "buddy" / "node3" / copy_dir_name(40)
        assert files_in(kept) == files_in(copy)
        held = read_checkpoint_manifest(kept / MANIFEST_NAME)
        assert (held.tier, held.of_node, held.held_on, held.where) == ("buddy", "node3", "node1", "node3's copy on node1")
        assert (held.shards, held.slot, held.slots, held.written_at) == (manifest.shards, 3, 4, manifest.written_at)
        assert received == [held]

        # node2 takes node3's slot after node3 is lost: it fetches the copy from node1 ...
        dest = tmp_path / "node2" / "buddy" / "node3" / copy_dir_name(40)
        received = fetch_copy("127.0.0.1", node1.port, KEY, "node3", 40, dest, timeout=SHORT, held_on="node2")
        assert files_in(dest) == files_in(copy)
        fetched = received.manifest
        assert fetched == read_checkpoint_manifest(dest / MANIFEST_NAME)
        assert (fetched.tier, fetched.held_on, fetched.shards) == ("buddy", "node2", manifest.shards)
        # What node2 measured of the bytes it wrote is the manifest's: nothing needs hashing again.
        assert received.measured == manifest.shards and received.problem() == ""

        # ... and node3, back on its feet with an empty local tier, fetches its own copy from node2.
        back = tmp_path / "node3-again" / "local" / copy_dir_name(40)
        own = fetch_copy("127.0.0.1", node2.port, KEY, "node3", 40, back, timeout=SHORT, held_on="node3").manifest
        assert files_in(back) == files_in(copy)
        assert (own.tier, own.held_on) == ("local", "node3")
        assert not [p for p in back.parent.iterdir() if p.name.startswith(".tmp-")]


def test_pushing_the_same_step_again_replaces_the_older_copy(tmp_path):
    copy, manifest = node3_saves_step_40(tmp_path / "node3")
    with CopyServer(tmp_path / "node1", "node1", KEY, 0, "127.0.0.1") as node1:
        push_copy("127.0.0.1", node1.port, KEY, copy, manifest, timeout=SHORT)
        (copy / ".metadata").write_bytes(b'{"step": 40, "again": true}')
        again = CheckpointManifest(step=40, of_node="node3", tier="local", held_on="node3", shards=shards_of(copy),
                                   written_at=1_700_000_100.0, save_seconds=1.0, slot=3, slots=4)
        push_copy("127.0.0.1", node1.port, KEY, copy, again, timeout=SHORT)
    folder = tmp_path / "node1" / "buddy" / "node3"
    assert [p.name for p in folder.iterdir()] == [copy_dir_name(40)]
    assert files_in(folder / copy_dir_name(40)) == files_in(copy)
    assert read_checkpoint_manifest(folder / copy_dir_name(40) / MANIFEST_NAME).written_at == again.written_at


def test_a_copy_the_buddy_keeps_already_is_not_sent_again_unless_it_is_damaged_there(tmp_path):
    # Every node sends its newest copy again as a step starts (its buddy may be new); after a
    # recovery most buddies are the same nodes, which keep that copy already.
    copy, manifest = node3_saves_step_40(tmp_path / "node3")
    kept = tmp_path / "node1" / "buddy" / "node3" / copy_dir_name(40)
    with CopyServer(tmp_path / "node1", "node1", KEY, 0, "127.0.0.1") as node1:
        assert push_copy("127.0.0.1", node1.port, KEY, copy, manifest, timeout=SHORT) is True
        before = {name: os.stat(kept / name).st_ino for name in files_in(kept)}

        assert push_copy("127.0.0.1", node1.port, KEY, copy, manifest, timeout=SHORT) is False
        assert {name: os.stat(kept / name).st_ino for name in files_in(kept)} == before

        os.truncate(kept / "rank-3" / "__0_0.distcp", 100)  # lost on the buddy: sent again, whole
        assert push_copy("127.0.0.1", node1.port, KEY, copy, manifest, timeout=SHORT) is True
    assert files_in(kept) == files_in(copy)


def test_a_replacement_sending_back_the_copy_it_fetched_from_its_buddy_moves_no_bytes(tmp_path):
    # node3 is lost; node2 takes its slot, fetches node3's copy from node1 (the slot's buddy, so node2's
    # buddy too) and, once resumed, sends its own copy of that step, the same bytes, to node1.
    copy, manifest = node3_saves_step_40(tmp_path / "node3")
    received: list[CheckpointManifest] = []
    with CopyServer(tmp_path / "node1", "node1", KEY, 0, "127.0.0.1", on_received=received.append) as node1:
        push_copy("127.0.0.1", node1.port, KEY, copy, manifest, timeout=SHORT)
        staged = tmp_path / "node2" / "local" / copy_dir_name(40)
        fetched = fetch_copy("127.0.0.1", node1.port, KEY, "node3", 40, staged, timeout=SHORT, held_on="node2").manifest
        own = replace(fetched, of_node="node2", tier="local", held_on="node2")
        assert push_copy("127.0.0.1", node1.port, KEY, staged, own, timeout=SHORT) is False
    kept = tmp_path / "node1" / "buddy" / "node2" / copy_dir_name(40)
    assert files_in(kept) == files_in(copy)
    held = read_checkpoint_manifest(kept / MANIFEST_NAME)
    assert (held.of_node, held.tier, held.held_on, held.shards) == ("node2", "buddy", "node1", manifest.shards)
    assert [m.of_node for m in received] == ["node3", "node2"], "node1's holdings list node2's copy at once"
    node3s = tmp_path / "node1" / "buddy" / "node3" / copy_dir_name(40)
    assert all(os.stat(kept / name).st_ino == os.stat(node3s / name).st_ino for name in files_in(kept))


def test_a_buddy_whose_holdings_hook_fails_still_keeps_the_copy_and_says_why(tmp_path):
    copy, manifest = node3_saves_step_40(tmp_path / "node3")
    said: list[str] = []

    def holdings_unwritable(_: CheckpointManifest) -> None:
        raise PermissionError("holdings.json: read-only file system")

    with CopyServer(tmp_path / "node1", "node1", KEY, 0, "127.0.0.1", on_received=holdings_unwritable,
                    on_problem=said.append) as node1:
        push_copy("127.0.0.1", node1.port, KEY, copy, manifest, timeout=SHORT)
    assert files_in(tmp_path / "node1" / "buddy" / "node3" / copy_dir_name(40)) == files_in(copy)
    assert said == ["clusterctl copy server on node1: after keeping node3's copy on node1 of step 40: on_received "
                    "failed: PermissionError: holdings.json: read-only file system"]


def test_a_client_without_the_jobs_key_is_refused_and_nothing_is_written(tmp_path):
    copy, manifest = node3_saves_step_40(tmp_path / "node3")
    with CopyServer(tmp_path / "node1", "node1", KEY, 0, "127.0.0.1") as node1:
        with pytest.raises(TransferError, match="refused the request: authentication failed"):
            push_copy("127.0.0.1", node1.port, OTHER_JOBS_KEY, copy, manifest, timeout=SHORT)
        with pytest.raises(TransferError, match="authentication failed"):
            fetch_copy("127.0.0.1", node1.port, OTHER_JOBS_KEY, "node3", 40, tmp_path / "stolen", timeout=SHORT)
    assert not (tmp_path / "node1" / "buddy").exists()
    assert not (tmp_path / "stolen").exists()


def test_a_shard_changed_after_its_manifest_is_refused_by_name_and_nothing_is_kept(tmp_path):
    copy, manifest = node3_saves_step_40(tmp_path / "node3")
    shard = copy / "rank-3" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[1 << 20] ^= 0xFF  # same size, different bytes: only the checksum can tell
    shard.write_bytes(bytes(data))
    received: list[CheckpointManifest] = []
    with CopyServer(tmp_path / "node1", "node1", KEY, 0, "127.0.0.1", on_received=received.append) as node1:
        with pytest.raises(TransferError, match=r"shard rank-3/__0_0\.distcp fails its checksum"):
            push_copy("127.0.0.1", node1.port, KEY, copy, manifest, timeout=SHORT)
    folder = tmp_path / "node1" / "buddy" / "node3"
    assert list(folder.iterdir()) == []
    assert received == []


def test_a_damaged_copy_on_the_buddy_is_not_staged(tmp_path):
    copy, manifest = node3_saves_step_40(tmp_path / "node3")
    with CopyServer(tmp_path / "node1", "node1", KEY, 0, "127.0.0.1") as node1:
        push_copy("127.0.0.1", node1.port, KEY, copy, manifest, timeout=SHORT)
        (tmp_path / "node1" / "buddy" / "node3" / copy_dir_name(40) / ".metadata").write_bytes(b'{"step": 41}')
        dest = tmp_path / "node2" / "local" / copy_dir_name(40)
        with pytest.raises(TransferError, match=r"shard \.metadata fails its checksum.*take the next tier"):
            fetch_copy("127.0.0.1", node1.port, KEY, "node3", 40, dest, timeout=SHORT)
    assert list(dest.parent.iterdir()) == []


def test_fetching_a_copy_the_node_does_not_hold_says_so(tmp_path):
    with CopyServer(tmp_path / "node1", "node1", KEY, 0, "127.0.0.1") as node1:
        with pytest.raises(TransferError, match="node1 holds no complete copy of node3's shards of step 40"):
            fetch_copy("127.0.0.1", node1.port, KEY, "node3", 40, tmp_path / "dest", timeout=SHORT)
    assert not (tmp_path / "dest").exists()


def test_a_node_whose_server_is_gone_is_a_transfer_error_within_the_timeout(tmp_path):
    copy, manifest = node3_saves_step_40(tmp_path / "node3")
    with CopyServer(tmp_path / "node1", "node1", KEY, 0, "127.0.0.1") as node1:
        port = node1.port
    started = time.monotonic()
    with pytest.raises(TransferError, match="connection refused.*no copy server runs on 127.0.0.1"):
        push_copy("127.0.0.1", port, KEY, copy, manifest, timeout=2.0)
    with pytest.raises(TransferError, match="connection refused"):
        fetch_copy("127.0.0.1", port, KEY, "node3", 40, tmp_path / "dest", timeout=2.0)
    assert time.monotonic() - started < 4.0


def test_a_sender_that_goes_away_mid_shard_leaves_nothing_on_its_buddy(tmp_path):
    copy, manifest = node3_saves_step_40(tmp_path / "node3")
    node1 = CopyServer(tmp_path / "node1", "node1", KEY, 0, "127.0.0.1").start()
    try:
        with socket.create_connection(("127.0.0.1", node1.port), timeout=SHORT) as sock:
            greeting = sock.recv(len(MAGIC) + NONCE_BYTES, socket.MSG_WAITALL)
            assert greeting.startswith(MAGIC)
            server_nonce, client_nonce = greeting[len(MAGIC):], os.urandom(NONCE_BYTES)
            header = CopyRequest("push", "node3", 40, manifest).to_bytes()
            mac = hmac.new(KEY, REQUEST_LABEL + server_nonce + client_nonce + header, hashlib.sha256).digest()
            sock.sendall(client_nonce + struct.pack(">I", len(header)) + header + mac)
            for shard in manifest.shards:  # every shard whole but the last, of which half is sent
                data = (copy / shard.name).read_bytes()
                sock.sendall(struct.pack(">H", len(shard.name)) + shard.name.encode() + struct.pack(">Q", shard.size))
                sock.sendall(data if shard is not manifest.shards[-1] else data[:len(data) // 2])
            assert manifest.shards[-1].name == "rank-3/__0_0.distcp"
    finally:
        node1.close()  # waits for the transfer to end
    assert list((tmp_path / "node1" / "buddy" / "node3").iterdir()) == []


def test_whatever_a_stranger_sends_the_server_refuses_and_keeps_serving(tmp_path):
    copy, manifest = node3_saves_step_40(tmp_path / "node3")
    header = CopyRequest("push", "node3", 40, manifest).to_bytes()
    strangers = [
        b"",                                                          # connects and goes
        b"GET / HTTP/1.1\r\nHost: node1\r\n\r\n",                     # the wrong program
        os.urandom(NONCE_BYTES) + struct.pack(">I", 0xFFFFFFFF),      # a header too large to read
        os.urandom(NONCE_BYTES) + struct.pack(">I", len(header)) + header + os.urandom(32),  # a guessed MAC
    ]
    said: list[str] = []
    with CopyServer(tmp_path / "node1", "node1", KEY, 0, "127.0.0.1", on_problem=said.append) as node1:
        for garbage in strangers:
            with socket.create_connection(("127.0.0.1", node1.port), timeout=SHORT) as sock:
                sock.sendall(garbage)
                sock.shutdown(socket.SHUT_WR)
                while sock.recv(1 << 16):
                    pass
        push_copy("127.0.0.1", node1.port, KEY, copy, manifest, timeout=SHORT)
    assert said == []
    assert [p.name for p in (tmp_path / "node1" / "buddy" / "node3").iterdir()] == [copy_dir_name(40)]


def test_a_server_running_its_limit_of_transfers_asks_the_next_one_to_try_again(tmp_path):
    copy, manifest = node3_saves_step_40(tmp_path / "node3")
    with CopyServer(tmp_path / "node1", "node1", KEY, 0, "127.0.0.1", max_connections=1) as node1:
        with socket.create_connection(("127.0.0.1", node1.port), timeout=SHORT) as slow:
            # A push of the job's own that stalls after its answer: it holds the one transfer slot.
            greeting = slow.recv(len(MAGIC) + NONCE_BYTES, socket.MSG_WAITALL)
            header, nonce = CopyRequest("push", "node3", 40, manifest).to_bytes(), os.urandom(NONCE_BYTES)
            mac = hmac.new(KEY, REQUEST_LABEL + greeting[len(MAGIC):] + nonce + header, hashlib.sha256).digest()
            slow.sendall(nonce + struct.pack(">I", len(header)) + header + mac)
            assert slow.recv(4, socket.MSG_WAITALL) != bytes(4)  # answered: the slot is taken
            with pytest.raises(TransferError, match="node1's copy of step 40 from 127.0.0.1: 127.0.0.1 is busy"):
                fetch_copy("127.0.0.1", node1.port, KEY, "node1", 40, tmp_path / "dest", timeout=SHORT)
        deadline = time.monotonic() + SHORT
        while True:  # the slow client is gone: its slot frees as soon as the server notices
            try:
                fetch_copy("127.0.0.1", node1.port, KEY, "node1", 40, tmp_path / "dest", timeout=SHORT)
            except TransferError as exc:
                if "busy" in str(exc) and time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                assert "node1 holds no complete copy" in str(exc)
                break
        assert node1.refused["busy"] >= 1


def test_a_request_reads_back_as_sent_and_only_a_local_copy_is_pushed():
    local = CheckpointManifest(step=40, of_node="node3", tier="local", held_on="node3",
                               shards=(Shard("rank-3/__0_0.distcp", 10, "ab" * 32),), written_at=1.0, save_seconds=0.5,
                               slot=3, slots=4)
    for request in (CopyRequest("fetch", "node3", 40), CopyRequest("push", "node3", 40, local)):
        assert parse_copy_request(request.to_bytes()) == request
    buddy = replace(local, tier="buddy", held_on="node1")
    with pytest.raises(TransferError, match="a pushed copy is the sender's local copy, not a buddy copy"):
        parse_copy_request(CopyRequest("push", "node3", 40, buddy).to_bytes())


def test_a_node_running_another_clusterctl_is_told_to_reinstall():
    older = b'{"kind":"copy-request","version":1,"request":"fetch","of_node":"node3","step":40}'
    with pytest.raises(TransferError, match="version 1; this clusterctl speaks version 2 .*reinstall it"):
        parse_copy_request(older)


REQUEST_PIECES = st.sampled_from([
    b'{"kind":"copy-request","version":2,', b'"request":"fetch",', b'"request":"push",', b'"of_node":"node3",',
    b'"of_node":"../x",', b'"step":40', b'"step":-1', b'"step":1e400', b'"manifest":{}', b'"manifest":null',
    b'"version":1', b'}', b'{', b'[', b',', b'"', b'\xff', b'NaN', b'"extra":1,'])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=200), st.lists(REQUEST_PIECES, max_size=8).map(b"".join)))
def test_any_request_header_is_parsed_or_refused_never_another_exception(raw):
    try:
        request = parse_copy_request(raw)
    except TransferError as exc:
        assert str(exc).startswith("request header")
    else:
        assert parse_copy_request(request.to_bytes()) == request
