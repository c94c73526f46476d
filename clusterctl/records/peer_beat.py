"""One node's beat to its neighbours: "this node's reporter is alive", every PEER_BEAT_SECONDS.

Sent by each node's reporter (clusterctl.launcher.job.reporter) to the reporters of its two
neighbours in the step (launcher/pure/peer_watch.py: a ring over the step's nodes), as one small
UDP datagram over the job's own network: a node that stops beating (powered off, its link cut, its
kernel gone) is noticed by its neighbours within PEER_SILENT_SECONDS, whatever the job's size, and
they tell the agent at once in their next report (`NodeReport.silent_peers`).  Nothing reaches
slurmctld or shared storage; each node sends two and receives two datagrams per beat.

Wire format: ``MAGIC`` (4 bytes), an HMAC-SHA256 of the body under the job's report key (the same
key as the node reports, clusterctl.records.node_report), then the body as compact UTF-8 JSON.  A
datagram not signed with the job's key is refused before its body is parsed; one whose body is not
exactly this record is refused with a RecordError saying what is wrong.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

from clusterctl.records.versioned import RecordError, check_header, field, header
from clusterctl.slurm.names import node_name_problem

KIND = "peer-beat"
VERSION = 1
MAGIC = b"CCP1"
DIGEST_BYTES = 32
MAX_DATAGRAM = 512
MAX_TEXT = 64
PEER_PORT_ENV = "CLUSTERCTL_PEER_PORT"
"""The UDP port every reporter of the step listens on for its neighbours' beats (chosen by the agent)."""
PEER_PORTS = (20000, 32768)
"""The agent picks each step's peer port in this range: below Linux's ephemeral ports (32768-60999), so
no outgoing connection holds it by chance; only a service listening there could (then that node's
neighbours are watched by their other neighbour, and the reporter says so)."""


@dataclass(frozen=True)
class PeerBeat:
    """A node's reporter says it is alive (`leaving`: its step ends on this node; stop watching it)."""

    job_id: str
    launch: str
    node: str
    seq: int
    leaving: bool = False

    def to_json(self) -> dict[str, Any]:
        """The record as sent."""
        return {**header(KIND, VERSION), "job_id": self.job_id, "launch": self.launch, "node": self.node,
                "seq": self.seq, "leaving": self.leaving}

    @classmethod
    def from_json(cls, data: object, where: str) -> PeerBeat:
        """Parse a received beat; RecordError for anything not exactly understood."""
        body = check_header(data, KIND, VERSION, where)
        extra = set(body) - {"kind", "version", "job_id", "launch", "node", "seq", "leaving"}
        if extra:
            raise RecordError(where, f"unknown fields {', '.join(sorted(extra))}")
        texts = {}
        for key in ("job_id", "launch", "node"):
            value = field(body, key, str, where)
            if not value or len(value) > MAX_TEXT or not value.isprintable():
                raise RecordError(where, f"field `{key}` must be 1-{MAX_TEXT} printable characters")
            texts[key] = value
        problem = node_name_problem(texts["node"])
        if problem:
            raise RecordError(where, f"field `node`: {problem}")
        seq = field(body, "seq", int, where)
        if isinstance(seq, bool) or seq < 0:
            raise RecordError(where, "field `seq` must be a whole number ≥ 0")
        leaving = field(body, "leaving", bool, where)
        return cls(texts["job_id"], texts["launch"], texts["node"], seq, leaving)


def encode_beat(beat: PeerBeat, key: bytes) -> bytes:
    """The datagram for `beat`, signed with the job's `key`."""
    body = json.dumps(beat.to_json(), separators=(",", ":")).encode()
    return MAGIC + hmac.digest(key, body, hashlib.sha256) + body


def decode_beat(datagram: bytes, key: bytes, where: str) -> PeerBeat:
    """The beat in `datagram`; RecordError when it is too large, not signed with `key`, or not a beat.
    The signature is checked before anything of the body is read."""
    if len(datagram) > MAX_DATAGRAM:
        raise RecordError(where, f"{len(datagram)} bytes: a peer beat is at most {MAX_DATAGRAM}")
    if not datagram.startswith(MAGIC) or len(datagram) < len(MAGIC) + DIGEST_BYTES:
        raise RecordError(where, "not a clusterctl peer beat (wrong magic)")
    digest, body = datagram[len(MAGIC):len(MAGIC) + DIGEST_BYTES], datagram[len(MAGIC) + DIGEST_BYTES:]
    if not hmac.compare_digest(digest, hmac.digest(key, body, hashlib.sha256)):
        raise RecordError(where, "not signed with this job's key (from outside the job, or damaged)")
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RecordError(where, f"not a readable JSON beat ({exc.__class__.__name__})") from None
    return PeerBeat.from_json(data, where)


def parse_peer_port(text: str) -> int:
    """The peer port setting; ValueError saying what is wrong."""
    if not text.isdigit() or not 1024 <= int(text) < 65536:
        raise ValueError(f"{text!r} is not a port number from 1024 to 65535")
    return int(text)
