"""Moving copies between nodes: the `CopyTransport` door (TCP by default, a fake in tests) and the
`CopyLink` a checkpointer's parts use, which carries the job's key, port and transfer timeout."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from clusterctl.checkpoint.copies import ReceivedCopy
from clusterctl.records.checkpoint_manifest import CheckpointManifest

TRANSFER_TIMEOUT = 120.0
"""Seconds a push to the buddy or a fetch from it may take before it counts as failed."""


class CopyService(Protocol):
    """A running copy server (the node's first rank serves fetches and receives its buddy's pushes)."""

    @property
    def refused(self) -> Mapping[str, int]:
        """Connections turned away since it started, by reason (COPY_REFUSALS)."""

    def close(self) -> None:
        """Stop serving."""


class CopyTransport(Protocol):
    """Moving copies between nodes (clusterctl.checkpoint.transport over TCP; a fake in tests).

    Any exception from `push` or `fetch` means the copy did not move; the caller carries on."""

    def push(self, host: str, port: int, key: bytes, copy_dir: Path, manifest: CheckpointManifest, *,
             timeout: float) -> None:
        """Send the copy in `copy_dir` to `host`'s server, which keeps it as its buddy copy of manifest.of_node."""

    def fetch(self, host: str, port: int, key: bytes, of_node: str, step: int, dest_dir: Path, *,
              timeout: float) -> ReceivedCopy:
        """Fetch `of_node`'s copy of `step` held on `host` into `dest_dir` (made, empty): its manifest and
        every shard's size and SHA-256 as measured while the bytes were written (a transport hashes
        what it receives; the caller loads a copy whose measurements equal its manifest without
        hashing it again, and never one whose measurements differ)."""

    def serve(self, tier_root: Path, node: str, key: bytes, port: int,
              on_received: Callable[[CheckpointManifest], None]) -> CopyService:
        """Start serving `tier_root` on `port`; `on_received` runs after a buddy copy lands."""


class TcpTransport:
    """The default transport: clusterctl.checkpoint.transport, imported when first used (a training
    program that never moves a copy never loads the socket code)."""

    def push(self, host: str, port: int, key: bytes, copy_dir: Path, manifest: CheckpointManifest, *,
             timeout: float) -> None:
        """See CopyTransport.push."""
        from clusterctl.checkpoint.transport import push_copy

        push_copy(host, port, key, copy_dir, manifest, timeout=timeout)

    def fetch(self, host: str, port: int, key: bytes, of_node: str, step: int, dest_dir: Path, *,
              timeout: float) -> ReceivedCopy:
        """See CopyTransport.fetch."""
        from clusterctl.checkpoint.transport import fetch_copy

        return fetch_copy(host, port, key, of_node, step, dest_dir, timeout=timeout)

    def serve(self, tier_root: Path, node: str, key: bytes, port: int,
              on_received: Callable[[CheckpointManifest], None]) -> CopyService:
        """See CopyTransport.serve."""
        from clusterctl.checkpoint.transport import CopyServer

        return CopyServer(tier_root, node, key, port, on_received=on_received).start()


@dataclass(frozen=True)
class CopyLink:
    """One checkpointer's way to the other nodes' copy servers: `transport` with the job's `key`, the
    servers' `port` and the `timeout` of one push or fetch."""

    transport: CopyTransport
    key: bytes
    port: int
    timeout: float

    def push(self, host: str, copy_dir: Path, manifest: CheckpointManifest) -> None:
        """See CopyTransport.push."""
        self.transport.push(host, self.port, self.key, copy_dir, manifest, timeout=self.timeout)

    def fetch(self, host: str, of_node: str, step: int, dest_dir: Path) -> ReceivedCopy:
        """See CopyTransport.fetch."""
        return self.transport.fetch(host, self.port, self.key, of_node, step, dest_dir, timeout=self.timeout)

    def serve(self, tier_root: Path, node: str, on_received: Callable[[CheckpointManifest], None]) -> CopyService:
        """See CopyTransport.serve."""
        return self.transport.serve(tier_root, node, self.key, self.port, on_received)
