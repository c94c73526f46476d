"""The tests' doors: one fake per door Protocol, shared by every test that needs that door.

- `FakePartition` — one Slurm partition as healthd sees it, node by node: calling it with a node's name
  gives that node's `NodeSlurm` (clusterctl/slurm/nodes.py), so it is also a hooks' `slurm_factory`.
- `FakeNodeTable` — Slurm's node table one level lower, as a `Runner` (clusterctl/slurm/commands.py):
  it answers the argv `SlurmNode` really runs, in the shapes Slurm 22.05 prints them.
- `SlowController` — a `Runner` in front of a slow or stopped slurmctld, on a clock of its own.
- `FakeNvmlDriver` — NVML's answers at the one call door (`NvmlCalls`, healthd/nvml.py), below `Nvml`.
- `FakeNvml` — `NvmlReader` (healthd/nvml.py) answering from a table of samples, with no NVML library.
- `FakeCopyNetwork` — `CopyTransport` (clusterctl/checkpoint/link.py): every node's copy server in one
  process, copying checkpoint copies between tier roots.
- `FakeGit` — `GitDoor` (launcher/login/code_version.py): git's answers about a workdir, as git 2.39 gave
  them (LC_ALL=C), for the cases a test cannot make for real (a tree owned by another user, a slow status).

`_fakes_satisfy_the_doors` at the end is checked by mypy (scripts/lint.sh): a fake that drifts from
its Protocol fails the lint, not a test far away.
"""

from __future__ import annotations

import ctypes
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

from clusterctl.checkpoint.link import CopyTransport
from clusterctl.checkpoint.copies import ReceivedCopy, file_sha256
from clusterctl.errors import SlurmCommandError
from clusterctl.healthd.checks import GpuSample
from clusterctl.healthd.nvml import GpuIdentity, NvmlCalls, NvmlReader, handle_address
from clusterctl.launcher.login.code_version import GitAnswer, GitDoor
from clusterctl.records.checkpoint_manifest import (
    CheckpointManifest, Shard, read_checkpoint_manifest, write_checkpoint_manifest)
from clusterctl.records.drain_reason import HEALTHD, DrainOwner
from clusterctl.slurm.commands import Completed, Runner
from clusterctl.slurm.nodes import NodeSlurm, NodeState, PartitionShare

HEALTHD_FAULT = "healthd: ecc-dbe gpu0 drain-reset 2026-11-22T00:00:00Z"
"""The reason of the nodes `FakePartition(drained_by_healthd=n)` starts drained."""


# ---- Slurm, one node at a time (NodeSlurm) -----------------------------------------------------

class FakePartition:
    """A partition of `size` idle nodes `node1`..`node<size>` (or the names given), as Slurm would report them.

    `drained_by_healthd`: that many nodes (the last ones) start drained with healthd's reason;
    `drained`: more nodes' reasons by name.  `reasons` is the live table (node → drain reason), shared by
    every node's door, so several daemons or hooks can drain in the same partition.  What the doors did
    is kept: `drains` (every drain's reason, in order) and `reads` ("node", "share", "size": each Slurm
    read).  `jobs`: what `jobs_here` answers on every node.  With `up` false every call raises
    SlurmCommandError, as when slurmctld cannot be reached.
    """

    def __init__(self, size: int | Sequence[str] = 10, *, name: str = "gpu", drained_by_healthd: int = 0,
                 drained: Mapping[str, str] | None = None, jobs: tuple[str, ...] = (), up: bool = True) -> None:
        self.nodes = [f"node{i}" for i in range(1, size + 1)] if isinstance(size, int) else list(size)
        self.name, self.jobs, self.up = name, jobs, up
        by_healthd = self.nodes[len(self.nodes) - drained_by_healthd:] if drained_by_healthd else []
        self.reasons: dict[str, str] = {node: HEALTHD_FAULT for node in by_healthd}
        self.reasons.update(drained or {})
        self.drains: list[str] = []
        self.reads: list[str] = []

    def __call__(self, node: str) -> FakeNodeSlurm:
        """Node `node`'s door (a hooks' `slurm_factory`)."""
        return FakeNodeSlurm(self, node)

    def check_up(self) -> None:
        if not self.up:
            raise SlurmCommandError(["sinfo"], 1, "Unable to contact slurm controller")

    def node_state(self, node: str) -> NodeState:
        """`node` as Slurm shows it now (no read is counted)."""
        if node not in self.nodes:
            raise SlurmCommandError(["sinfo", "-n", node], 0, f"node {node} not known to Slurm")
        reason = self.reasons.get(node, "")
        return NodeState(node, "idle", ("DRAIN",) if reason else (), reason, (self.name,))

    def share(self, partition: str, owner: DrainOwner = HEALTHD) -> PartitionShare:
        """The partition's size and its nodes drained by `owner` (no read is counted)."""
        return PartitionShare.of(partition, [self.node_state(node) for node in self.nodes], owner)


class FakeNodeSlurm:
    """One node's `NodeSlurm` in a `FakePartition`: what it does lands in the partition's table and records."""

    def __init__(self, partition: FakePartition, node: str) -> None:
        self.partition, self.node = partition, node

    def state(self) -> NodeState:
        self.partition.check_up()
        self.partition.reads.append("node")
        return self.partition.node_state(self.node)

    def partition_share(self, partition: str, owner: DrainOwner = HEALTHD) -> PartitionShare:
        self.partition.check_up()
        self.partition.reads.append("share")
        return self.partition.share(partition, owner)

    def partition_size(self, partition: str) -> int:
        self.partition.check_up()
        self.partition.reads.append("size")
        return len(self.partition.nodes)

    def drain(self, reason: str) -> None:
        self.partition.check_up()
        self.partition.drains.append(reason)
        self.partition.reasons[self.node] = reason

    def resume(self) -> None:
        self.partition.check_up()
        self.partition.reasons.pop(self.node, None)

    def jobs_here(self) -> tuple[str, ...]:
        self.partition.check_up()
        return self.partition.jobs


# ---- Slurm's node table, as a Runner ------------------------------------------------------------

class FakeNodeTable:
    """A partition of nodes, each idle or drained with a reason (`drained`: node → reason), answering
    `sinfo -h -n N -o %N|%T|%P|%E`, `sinfo -h -p P -o %D|%T|%E` and `scontrol update NodeName=...` as
    Slurm 22.05 prints them; every argv it was given is kept (`calls`)."""

    def __init__(self, nodes: Sequence[str], drained: dict[str, str] | None = None, partition: str = "gpu",
                 down: Sequence[str] = ()) -> None:
        self.nodes, self.partition = list(nodes), partition
        self.reasons = dict(drained or {})
        self.down = set(down)
        self.calls: list[list[str]] = []
        self.drains: list[tuple[str, str]] = []
        """(node, reason) of every drain made."""

    def _state(self, node: str) -> str:
        if node in self.reasons:
            return "drained" if node not in self.down else "down+drain"
        return "down*" if node in self.down else "idle"

    def updates(self) -> list[list[str]]:
        """Every `scontrol update` given."""
        return [argv for argv in self.calls if argv[:2] == ["scontrol", "update"]]

    def __call__(self, argv: Sequence[str], timeout: float) -> Completed:
        argv = list(argv)
        self.calls.append(argv)
        if argv[:3] == ["sinfo", "-h", "-n"]:
            node = argv[3]
            if node not in self.nodes:
                return Completed(0, "", "")
            reason = self.reasons.get(node, "not responding" if node in self.down else "none")
            return Completed(0, f"{node}|{self._state(node)}|{self.partition}*|{reason}\n", "")
        if argv[:3] == ["sinfo", "-h", "-p"]:
            groups: dict[tuple[str, str], int] = {}
            for node in self.nodes:
                key = (self._state(node), self.reasons.get(node, "none"))
                groups[key] = groups.get(key, 0) + 1
            return Completed(0, "".join(f"{count}|{state}|{reason}\n" for (state, reason), count in groups.items()), "")
        if argv[:2] == ["scontrol", "update"]:
            fields = dict(arg.split("=", 1) for arg in argv[2:])
            if fields.get("State") == "DRAIN":
                self.reasons[fields["NodeName"]] = fields["Reason"]
                self.drains.append((fields["NodeName"], fields["Reason"]))
            elif fields.get("State") == "RESUME":
                self.reasons.pop(fields["NodeName"], None)
            return Completed(0, "", "")
        return Completed(1, "", f"unexpected command {argv}")


class SlowController:
    """slurmctld overloaded (each command answered after `delay` seconds, by `answers`) or stopped
    (`answers` None: never answered), as a `Runner`.  The waiting happens on this fake's own clock
    (`clock`, for a hook's `clock`): no real time passes.  A command whose timeout is shorter than the
    wait uses it up and fails as `subprocess_runner` does then.  `timeouts`: each command's, in order."""

    def __init__(self, answers: Runner | None = None, delay: float = 0.0, *, start: float = 1000.0) -> None:
        self.answers, self.delay, self.start = answers, delay, start
        self.now = start
        self.timeouts: list[float] = []

    def clock(self) -> float:
        return self.now

    def __call__(self, argv: Sequence[str], timeout: float) -> Completed:
        self.timeouts.append(timeout)
        if self.answers is None or timeout < self.delay:
            self.now += timeout
            raise SlurmCommandError(list(argv), None, f"no answer within {timeout:g} s")
        self.now += self.delay
        return self.answers(argv, timeout)


# ---- NVML --------------------------------------------------------------------------------------

DRIVER_HANDLE_BASE = 0x1000
"""GPU i's handle from `FakeNvmlDriver` is the pointer DRIVER_HANDLE_BASE + i."""


class FakeNvmlDriver:
    """NVML's answers at the call door (`NvmlCalls`) for `count` GPUs, GPU i at PCI 0000:1i:00; GPUs in
    `lost` answer NVML_ERROR_GPU_IS_LOST.  `before[name]` runs once, just before that call: where another
    thread could run while this one waits on the driver, so a test interleaves two threads deterministically."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.lost: set[int] = set()
        self.before: dict[str, Callable[[], None]] = {}

    def __call__(self, name: str, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
        hook = self.before.pop(name, None)
        if hook is not None:
            hook()
        if name == "nvmlDeviceGetCount":
            return self.count
        if name == "nvmlDeviceGetHandleByIndex":
            return ctypes.c_void_p(DRIVER_HANDLE_BASE + args[0])
        if name in ("nvmlEventSetCreate", "nvmlEventSetFree"):
            return object()
        index = handle_address(args[0]) - DRIVER_HANDLE_BASE
        if index in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        answers = {"nvmlDeviceGetUUID": f"GPU-{index}",
                   "nvmlDeviceGetPciInfo": SimpleNamespace(busId=f"0000:1{index}:00.0"),
                   "nvmlDeviceGetSupportedEventTypes": pynvml.nvmlEventTypeXidCriticalError,
                   "nvmlDeviceRegisterEvents": None}
        return answers[name]


class FakeNvml:
    """`NvmlReader` answering from a table: `count` GPUs, `samples[i]` GPU i's sample or the error reading
    it raises; `discover` raises `discover` when given.  `calls` keeps init, each sample and shutdown."""

    def __init__(self, count: int, samples: Mapping[int, GpuSample | Exception],
                 discover: Exception | None = None) -> None:
        self.gpus, self.samples, self.discover_error = count, dict(samples), discover
        self.calls: list[str] = []

    def init(self) -> None:
        self.calls.append("init")

    def count(self) -> int:
        return self.gpus

    def discover(self) -> list[GpuIdentity]:
        if self.discover_error:
            raise self.discover_error
        return []

    def sample(self, index: int) -> GpuSample:
        self.calls.append(f"sample {index}")
        answer = self.samples[index]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def shutdown(self) -> None:
        self.calls.append("shutdown")


def _fakes_satisfy_the_doors() -> None:
    """Never called: mypy checks each fake against its door's Protocol (scripts/lint.sh)."""
    partition = FakePartition()
    node: NodeSlurm = partition("node3")
    factory: Callable[[str], NodeSlurm] = partition
    runner: Runner = FakeNodeTable(["node1"])
    slow: Runner = SlowController(runner, 1.0)
    calls: NvmlCalls = FakeNvmlDriver(1)
    reader: NvmlReader = FakeNvml(1, {})
    copies: CopyTransport = FakeCopyNetwork()
    git: GitDoor = FakeGit.clean("0" * 40)
    del node, factory, runner, slow, calls, reader, copies, git


# ---- git, about a launch workdir (GitDoor) ------------------------------------------------------

class FakeGit:
    """git's answers to `rev-parse --verify HEAD` (`head`) and `status --porcelain` (`status`); every call
    is kept in `calls` (argv, timeout).  Change `head`/`status` between attempts to move the workdir on."""

    def __init__(self, head: GitAnswer, status: GitAnswer) -> None:
        self.head = head
        self.status = status
        self.calls: list[tuple[list[str], float]] = []

    def __call__(self, argv: Sequence[str], timeout: float) -> GitAnswer:
        self.calls.append((list(argv), timeout))
        return self.head if "rev-parse" in argv else self.status

    @classmethod
    def clean(cls, commit: str) -> FakeGit:
        """A tree at `commit` with no change to a tracked file."""
        return cls(GitAnswer(0, f"{commit}\n", ""), GitAnswer(0, "", ""))

    @classmethod
    def dirty(cls, commit: str) -> FakeGit:
        """A tree at `commit` with a tracked file changed."""
        return cls(GitAnswer(0, f"{commit}\n", ""), GitAnswer(0, " M train.py\n", ""))

    @classmethod
    def owned_by_another_user(cls, workdir: str) -> FakeGit:
        """A tree another user owns: git refuses to read it (what git 2.39 said, recorded as root)."""
        said = (f"fatal: detected dubious ownership in repository at '{workdir}'\nTo add an exception for this "
                f"directory, call:\n\n\tgit config --global --add safe.directory {workdir}\n")
        return cls(GitAnswer(128, "", said), GitAnswer(128, "", said))

    @classmethod
    def slow_status(cls, commit: str) -> FakeGit:
        """A tree at `commit` whose status does not answer in time (what `run_git` returns then)."""
        return cls(GitAnswer(0, f"{commit}\n", ""),
                   GitAnswer(None, "", "git gave no answer within 5 s (a very large or slow repository?)"))


# ---- moving checkpoint copies between nodes (CopyTransport) -------------------------------------

class FakeCopyNetwork:
    """Every node's copy server in one process (clusterctl.checkpoint.link.CopyTransport): a push or a
    fetch copies files between the nodes' tier roots, byte for byte, as the TCP transport would.  A
    fetch hashes what it wrote and, as the TCP transport does, refuses a copy whose bytes do not match
    its manifest (a TransferError naming the shard), else returns its measurements.

    `gone`: nodes whose server refuses (a dead or unreachable node).  `starting`: nodes whose server
    refuses the next N calls as one not listening yet would (a retryable TransferError).  `unchecked`:
    nodes whose fetches hand over whatever bytes they copied with honest measurements but without
    refusing a mismatch (a transport that forgot to check: the caller must still never load it).
    `pushes`: (from, to, step) sent."""

    def __init__(self) -> None:
        self.servers: dict[str, FakeCopyServer] = {}
        self.gone: set[str] = set()
        self.starting: dict[str, int] = {}
        self.unchecked: set[str] = set()
        self.pushes: list[tuple[str, str, int]] = []

    def serve(self, tier_root: Path, node: str, key: bytes, port: int,
              on_received: Callable[[CheckpointManifest], None]) -> FakeCopyServer:
        server = FakeCopyServer(self, tier_root, node, on_received)
        self.servers[node] = server
        return server

    def _server(self, host: str) -> FakeCopyServer:
        if self.starting.get(host, 0) > 0:
            self.starting[host] -= 1
            from clusterctl.checkpoint.transport import TransferError
            raise TransferError(f"{host}: connection refused: its server is not up yet", retryable=True)
        if host in self.gone or host not in self.servers:
            raise ConnectionRefusedError(f"{host}: connection refused")
        return self.servers[host]

    def push(self, host: str, port: int, key: bytes, copy_dir: Path, manifest: CheckpointManifest, *,
             timeout: float) -> None:
        server = self._server(host)
        final = server.root / "buddy" / manifest.of_node / f"step-{manifest.step:012d}"
        tmp = final.with_name(f".tmp-push-{manifest.step}")
        shutil.rmtree(tmp, ignore_errors=True)
        _copy_files(copy_dir, tmp, manifest)
        kept = replace(manifest, tier="buddy", held_on=host)
        write_checkpoint_manifest(tmp / "manifest.json", kept)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        self.pushes.append((manifest.of_node, host, manifest.step))
        server.on_received(kept)

    def fetch(self, host: str, port: int, key: bytes, of_node: str, step: int, dest_dir: Path, *,
              timeout: float) -> ReceivedCopy:
        server = self._server(host)
        source = (server.root / "local" if of_node == host else server.root / "buddy" / of_node) / f"step-{step:012d}"
        manifest = read_checkpoint_manifest(source / "manifest.json")
        _copy_files(source, dest_dir, manifest)
        received = ReceivedCopy(manifest, tuple(Shard(s.name, *file_sha256(dest_dir / s.name))
                                                for s in manifest.shards))
        if host not in self.unchecked and (problem := received.problem()):
            from clusterctl.checkpoint.transport import TransferError
            raise TransferError(f"fetching {of_node}'s copy of step {step} from {host}: the copy {problem}; "
                                "the fetched copy was discarded: take the next tier")
        return received


class FakeCopyServer:
    """One node's server in a FakeCopyNetwork."""

    def __init__(self, network: FakeCopyNetwork, root: Path, node: str,
                 on_received: Callable[[CheckpointManifest], None]) -> None:
        self.network, self.root, self.node, self.on_received = network, root, node, on_received
        self.closed = False
        self.refused: dict[str, int] = {}

    def close(self) -> None:
        self.closed = True
        self.network.servers.pop(self.node, None)


def _copy_files(source: Path, dest: Path, manifest: CheckpointManifest) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for shard in manifest.shards:
        (dest / shard.name).parent.mkdir(exist_ok=True)
        shutil.copyfile(source / shard.name, dest / shard.name)
