"""A reporter's line to its neighbours: beats sent to them and theirs received, never blocking.

One UDP socket per node's reporter, bound to the step's peer port (PEER_PORT_ENV, chosen by the
agent) on every address of the node; beats go to the two neighbours of launcher/pure/peer_watch.py
and are signed with the job's report key (clusterctl.records.peer_beat), so a datagram from outside
the job is refused unread.  Sends and receives never block: a neighbour that is gone costs a failed
sendto, nothing more; a name is looked up off the loop; a flood costs at most READ_PER_CALL reads
a tick.  What to do with the beats is the reporter's (clusterctl.launcher.job.reporter).
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

from clusterctl.launcher.job.name_cache import NameCache
from clusterctl.records.peer_beat import MAX_DATAGRAM, PeerBeat, decode_beat, encode_beat
from clusterctl.records.versioned import RecordError


READ_PER_CALL = 64
"""Datagrams one `received` reads at most: two neighbours beat every PEER_BEAT_SECONDS, so anything
past a few a tick is someone else's flood, and the reporter's loop must not spend its tick reading it."""


class PeerLink:
    """The reporter's peer socket: `send` a beat to each neighbour, `received` the beats waiting.

    `send_port` is the neighbours' port (theirs is the same step's: `port`, unless a harness says
    otherwise); names are looked up off the loop (clusterctl.launcher.job.name_cache)."""

    def __init__(self, key: bytes, port: int, peers: Sequence[str], send_port: int | None = None,
                 names: NameCache | None = None) -> None:
        self.key, self.port, self.peers = key, port, tuple(peers)
        self.send_port = port if send_port is None else send_port
        self.names = names if names is not None else NameCache()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.sock.bind(("0.0.0.0", port))
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)
        self.refused = 0
        for peer in self.peers:  # looked up now, off the loop: known by the first beat
            self.names.address(peer)

    @property
    def unresolved(self) -> set[str]:
        """The neighbours whose names did not resolve (their beats are not sent)."""
        return self.names.unresolved() & set(self.peers)

    def send(self, beat: PeerBeat) -> int:
        """Send `beat` to every neighbour whose address is known now; how many sends left this node."""
        datagram, sent = encode_beat(beat, self.key), 0
        for peer in self.peers:
            address = self.names.address(peer)
            if address is None:
                continue
            try:
                self.sock.sendto(datagram, (address, self.send_port))
                sent += 1
            except OSError:
                pass  # unreachable now: the neighbour's own watchers and the agent tell what that means
        return sent

    def received(self) -> list[PeerBeat]:
        """The beats waiting now, at most READ_PER_CALL datagrams read (refused ones counted in `refused`)."""
        beats: list[PeerBeat] = []
        for _ in range(READ_PER_CALL):
            try:
                datagram = self.sock.recv(MAX_DATAGRAM + 1)
            except OSError:  # BlockingIOError: none waiting
                return beats
            try:
                beats.append(decode_beat(datagram, self.key, "peer beat"))
            except RecordError:
                self.refused += 1
        return beats

    def close(self) -> None:
        """Stop beating and listening."""
        self.sock.close()
