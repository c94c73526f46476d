"""A reporter's line to its neighbours: beats sent to them and theirs received, never blocking.

One UDP socket per node's reporter, bound to the step's peer port (PEER_PORT_ENV, chosen by the
agent) on every address of the node; beats go to the two neighbours of launcher/pure/peer_watch.py
and are signed with the job's report key (clusterctl.records.peer_beat), so a datagram from outside
the job is refused unread.  Sends and receives never block: a neighbour that is gone costs a failed
sendto, nothing more.  What to do with the beats is the reporter's (clusterctl.launcher.job.reporter).
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

from clusterctl.records.peer_beat import MAX_DATAGRAM, PeerBeat, decode_beat, encode_beat
from clusterctl.records.versioned import RecordError


class PeerLink:
    """The reporter's peer socket: `send` a beat to each neighbour, `received` the beats waiting."""

    def __init__(self, key: bytes, port: int, peers: Sequence[str]) -> None:
        self.key, self.port, self.peers = key, port, tuple(peers)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.sock.bind(("0.0.0.0", port))
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)
        self.addresses: dict[str, tuple[str, int]] = {}
        self.refused = 0
        self.unresolved: set[str] = set()

    def send(self, beat: PeerBeat) -> int:
        """Send `beat` to every neighbour whose name resolves; how many sends left this node."""
        datagram, sent = encode_beat(beat, self.key), 0
        for peer in self.peers:
            address = self.addresses.get(peer)
            try:
                if address is None:
                    address = self.addresses[peer] = (socket.gethostbyname(peer), self.port)
                    self.unresolved.discard(peer)
                self.sock.sendto(datagram, address)
                sent += 1
            except socket.gaierror:
                self.unresolved.add(peer)
            except OSError:
                pass  # unreachable now: the neighbour's own watchers and the agent tell what that means
        return sent

    def received(self) -> list[PeerBeat]:
        """The beats waiting now (refused datagrams are counted in `refused`)."""
        beats: list[PeerBeat] = []
        while True:
            try:
                datagram = self.sock.recv(MAX_DATAGRAM + 1)
            except (BlockingIOError, InterruptedError):
                return beats
            except OSError:
                return beats
            try:
                beats.append(decode_beat(datagram, self.key, "peer beat"))
            except RecordError:
                self.refused += 1

    def close(self) -> None:
        """Stop beating and listening."""
        self.sock.close()
