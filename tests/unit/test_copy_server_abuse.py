"""Strangers cannot keep a job's checkpoint copies out of its copy server (issue 40): a connection takes a
transfer slot only once its request carries the job's key, the whole handshake has a deadline, one address
holds a bounded number of connections, and the server counts every connection it turned away, by reason.
Real servers and sockets on loopback; the count reaches the agent's summary through the node's holdings and its
reporter."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from clusterctl.checkpoint import Checkpointer
from clusterctl.checkpoint.copies import MANIFEST_NAME, shards_of
from clusterctl.checkpoint.link import TcpTransport
from clusterctl.checkpoint.transport import (
    BUSY, MAGIC, MAX_CONNECTIONS, CopyServer, TransferError, copy_dir_name, fetch_copy, push_copy)
from clusterctl.clock import parse_utc
from clusterctl.launcher.job.report_channel import ReportInbox
from clusterctl.launcher.job.signal_watch import SignalWatch, copy_refusals_text
from clusterctl.launcher.pure.node_signals import SignalPolicy
from clusterctl.records.checkpoint_holdings import HOLDINGS_NAME, CopyRefusals, read_holdings
from clusterctl.records.checkpoint_manifest import CheckpointManifest, write_checkpoint_manifest
from clusterctl.records.checkpoint_settings import CheckpointSettings
from tests.unit.test_checkpoint_resume_report import reporter as run_node_reporter

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


# ---- what the server refused reaches the agent's line ---------------------------------------------------------

class LoopbackTransport(TcpTransport):
    """The real TCP transport, its server on loopback at a port of the system's choosing (`server`)."""

    server: CopyServer | None = None

    def serve(self, tier_root: Path, node: str, key: bytes, port: int,
              on_received: Callable[[CheckpointManifest], None]) -> CopyServer:
        self.server = CopyServer(tier_root, node, key, 0, "127.0.0.1", on_received=on_received).start()
        return self.server


def test_a_wrong_key_refused_by_the_copy_server_shows_in_the_agents_summary_once(tmp_path):
    """The node's first rank serves copies (the real Checkpointer and CopyServer); a stranger asks with a wrong
    key twice; the rank's round writes the count into the node's holdings; the node's real reporter carries them
    over loopback UDP to the agent's inbox, and the agent's summary names the node, once."""
    settings = CheckpointSettings(run_key="0123456789abcdef", local_base=str(tmp_path / "shm"),
                                  shared_dir=str(tmp_path / "shared"), tier_index="", port=1)
    transport = LoopbackTransport()
    started = time.time()
    rank = Checkpointer(settings, node="node3", slot=0, slots=1, rank=0, local_rank=0, local_ranks=1, key=KEY,
                        transport=transport, background=False)
    inbox = ReportInbox(KEY, "127.0.0.1")
    try:
        assert transport.server is not None
        for _ in range(2):
            with pytest.raises(TransferError, match="authentication failed"):
                fetch_copy("127.0.0.1", transport.server.port, bytes(32), "node3", 40, tmp_path / "dest",
                           timeout=SHORT)
        deadline = time.monotonic() + SHORT
        while transport.server.refused != {"wrong key": 2} and time.monotonic() < deadline:
            time.sleep(0.01)
        rank.tend()
        assert rank.tier is not None
        # Another local rank rewriting the holdings (its resume) keeps what the first rank's server counted.
        kept = rank.tier.write_holdings().copies_refused
        assert kept is not None and kept.counts == (("wrong key", 2),)
        watch = SignalWatch(inbox, "4242", "0", ["node3"], SignalPolicy.for_nodes(1), time.time())
        assert watch.copies_refusing() == ""  # nothing heard yet
        run_node_reporter(tmp_path / "node", inbox.port, {
            **settings.to_env(), "CLUSTERCTL_REPORT_KEY": KEY.hex(), "CLUSTERCTL_REPORT_ADDR": f"127.0.0.1:{inbox.port}",
            "CLUSTERCTL_REPORT_LAUNCH": "0", "CLUSTERCTL_REPORT_INTERVAL": "1", "SLURM_JOB_ID": "4242",
            "SLURMD_NODENAME": "node3", "CLUSTERCTL_HEALTHD_STATE_DIR": "/nonexistent"})
        deadline = time.monotonic() + SHORT
        while "node3" not in watch.holdings() and time.monotonic() < deadline:
            watch.poll()
            time.sleep(0.01)
        said = watch.copies_refusing()
        assert said.startswith("node3 refused 2 checkpoint-copy connections (wrong key 2) since ")
        since = parse_utc(said.rsplit(" ", 1)[1])
        assert since is not None and started - 1 <= since <= time.time()
        assert watch.copies_refusing() == ""  # unchanged since the last summary: not said again
    finally:
        inbox.close()
        rank.close(finished=False)
    # The next step's server starts counting afresh: its first round clears the count of the one before.
    again = Checkpointer(settings, node="node3", slot=0, slots=1, rank=0, local_rank=0, local_ranks=1, key=KEY,
                         transport=LoopbackTransport(), background=False)
    try:
        again.tend()
        held = read_holdings(settings.tier_root("node3") / HOLDINGS_NAME)
        assert held is not None and held.copies_refused is None
    finally:
        again.close()


def test_the_agents_line_names_the_three_nodes_that_refused_most_and_counts_the_rest():
    grown = [(f"gpu{i:05d}", CopyRefusals(1_795_305_600.0, (("per peer", i), ("wrong key", 1)))) for i in range(12_500)]
    said = copy_refusals_text(grown)
    assert said == ("gpu12499 refused 12,500 checkpoint-copy connections (per peer 12,499, wrong key 1) since "
                    "2026-11-22T00:00:00Z; gpu12498 refused 12,499 checkpoint-copy connections (per peer 12,498, "
                    "wrong key 1) since 2026-11-22T00:00:00Z; gpu12497 refused 12,498 checkpoint-copy connections "
                    "(per peer 12,497, wrong key 1) since 2026-11-22T00:00:00Z; 12,497 more nodes refused "
                    f"{sum(i + 1 for i in range(12_497)):,}")
    assert copy_refusals_text([("node3", CopyRefusals(0.0, (("busy", 1),)))]) == \
        "node3 refused 1 checkpoint-copy connection (busy 1) since 1970-01-01T00:00:00Z"
    assert copy_refusals_text([]) == ""
