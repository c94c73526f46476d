"""Strangers cannot keep a job's checkpoint copies out of its copy server (issue 40): a connection takes a
transfer slot only once its request carries the job's key, the whole handshake has a deadline, one address
holds a bounded number of connections, and the server counts every connection it turned away, by reason.
Real servers and sockets on loopback."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from clusterctl.checkpoint.copies import MANIFEST_NAME, shards_of
from clusterctl.checkpoint.transport import (
    BUSY, MAGIC, MAX_CONNECTIONS, CopyServer, TransferError, copy_dir_name, fetch_copy, push_copy)
from clusterctl.records.checkpoint_manifest import CheckpointManifest, write_checkpoint_manifest

KEY = bytes(range(32))
SHORT = 10.0


def node3_saves_step_40(tier_root: Path) -> tuple[Path, CheckpointManifest]:
    copy = tier_root / "local" / copy_dir_name(40)
    copy.mkdir(parents=True)
    (copy / "model.bin").write_bytes(os.urandom(1 << 20))
    manifest = CheckpointManifest(step=40, of_node="node3", tier="local", held_on="node3", shards=shards_of(copy),
                                  written_at=1_700_000_000.0, save_seconds=1.0, slot=3, slots=4)
    write_checkpoint_manifest(copy / MANIFEST_NAME, manifest)
    return copy, manifest


def idle(port: int, source: str = "127.0.0.1") -> socket.socket:
    """A stranger's connection that reads the greeting and then says nothing."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=SHORT, source_address=(source, 0))
    assert sock.recv(len(MAGIC), socket.MSG_WAITALL) in (MAGIC, BUSY)
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    try:
        sock.settimeout(0.0)
        return sock.recv(1 << 16) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_idle_connections_do_not_keep_the_jobs_push_and_fetch_out(tmp_path):
    copy, manifest = node3_saves_step_40(tmp_path / "node3")
    with CopyServer(tmp_path / "node1", "node1", KEY, 0, "127.0.0.1") as node1:
        strangers = [idle(node1.port) for _ in range(MAX_CONNECTIONS + 2)]
        try:
            push_copy("127.0.0.1", node1.port, KEY, copy, manifest, timeout=SHORT)
            got = fetch_copy("127.0.0.1", node1.port, KEY, "node3", 40, tmp_path / "back", timeout=SHORT)
            assert got.manifest.step == 40 and not any(closed_by_server(s) for s in strangers)
        finally:
            for s in strangers:
                s.close()
    assert (tmp_path / "back" / "model.bin").read_bytes() == (copy / "model.bin").read_bytes()


def test_a_slow_loris_is_dropped_at_the_handshake_deadline_and_counted(tmp_path):
    with CopyServer(tmp_path / "node1", "node1", KEY, 0, "127.0.0.1", handshake_timeout=0.5) as node1:
        loris = idle(node1.port)
        try:
            dropped = False
            for _ in range(100):  # a byte every 50 ms: each read is quick, the whole request never comes
                try:
                    loris.sendall(b"x")
                except OSError:
                    dropped = True
                    break
                if closed_by_server(loris):
                    dropped = True
                    break
                loris.settimeout(SHORT)
                time.sleep(0.05)
            assert dropped
        finally:
            loris.close()
        deadline = time.monotonic() + SHORT
        while not node1.refused and time.monotonic() < deadline:
            time.sleep(0.01)
        assert node1.refused == {"timed out": 1}


def test_one_address_holds_a_bounded_number_of_connections_and_others_still_copy(tmp_path):
    copy, manifest = node3_saves_step_40(tmp_path / "node3")
    with CopyServer(tmp_path / "node1", "node1", KEY, 0, "127.0.0.1", per_peer=2) as node1:
        strangers = [idle(node1.port, "127.0.0.2") for _ in range(2)]
        try:
            with socket.create_connection(("127.0.0.1", node1.port), timeout=SHORT,
                                          source_address=("127.0.0.2", 0)) as third:
                assert third.recv(len(MAGIC), socket.MSG_WAITALL) == BUSY
            push_copy("127.0.0.1", node1.port, KEY, copy, manifest, timeout=SHORT)  # from 127.0.0.1
        finally:
            for s in strangers:
                s.close()
        assert node1.refused["per peer"] == 1
    assert (tmp_path / "node1" / "buddy" / "node3" / copy_dir_name(40) / "model.bin").exists()


def test_a_wrong_key_and_a_stranger_that_goes_are_counted(tmp_path):
    with CopyServer(tmp_path / "node1", "node1", KEY, 0, "127.0.0.1") as node1:
        with idle(node1.port) as gone:
            gone.shutdown(socket.SHUT_WR)
            gone.settimeout(SHORT)
            while gone.recv(1 << 16):
                pass
        with pytest.raises(TransferError, match="authentication failed"):
            fetch_copy("127.0.0.1", node1.port, bytes(32), "node1", 40, tmp_path / "dest", timeout=SHORT)
        deadline = time.monotonic() + SHORT
        while sum(node1.refused.values()) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert node1.refused == {"broken": 1, "wrong key": 1}
