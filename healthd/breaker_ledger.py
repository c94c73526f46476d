"""The breaker's shared ledger: drain slots on shared storage instead of a whole-table count per node.

Without it, each healthd about to drain asks slurmctld for the partition's drained share: one
whole-node-table read (REQUEST_NODE_INFO, 20-50 ms at 12,500 nodes) per node, so a fault seen
on every node at once costs the controller minutes of work.  With `breaker_dir` set, the share
lives in a root-owned directory on storage every node mounts: `<breaker_dir>/<partition>/`
holds at most `breaker_cap` files `slot-<i>`, one per node healthd drained, each also linked
as `node-<node>`.  A node claims a slot with link(2), which fails with EEXIST when another node
took that slot first: atomic on local filesystems and NFS alike, so the cap holds however many
nodes claim at once.  A node that finds no free slot does not drain and never reads the table;
its healthd gives the slot back when its node is resumed (by healthd or by an admin).

Every directory is opened relative to the one before it with O_NOFOLLOW and must belong to
this process's user (root) with no write for anyone else: a user who could plant a file there
could hold the breaker open (or shut) for the whole partition.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from clusterctl.files import UnsafePathError, check_entry_name, check_owned, open_owned_subdir
from clusterctl.records.healthd_breaker_slot import BreakerSlot, holder_name, slot_name
from clusterctl.records.versioned import RecordError


def breaker_cap(partition_nodes: int, max_share: float) -> int:
    """How many nodes of a partition healthd may hold drained: the most that stays within `max_share`."""
    return math.floor(partition_nodes * max_share + 1e-9)


@dataclass(frozen=True)
class Claim:
    """What claiming a drain slot came to."""

    granted: bool
    held_by_others: int
    """Slots other nodes hold (what the breaker counts against the cap)."""
    slot: BreakerSlot | None
    """The slot this node holds now (granted), or None."""
    new: bool
    """This claim took the slot (give it back if the drain does not happen); False: held already."""


class BreakerLedger:
    """The drain slots under `root` as one node sees them (`node`: this node's Slurm name)."""

    def __init__(self, root: Path, node: str, *, now: Callable[[], float],
                 shuffle: Callable[[list[int]], None] = random.shuffle) -> None:
        self.root, self.node = root, check_entry_name(node)
        self.now, self.shuffle = now, shuffle

    @contextmanager
    def _partition_dir(self, partition: str) -> Iterator[int]:
        try:
            root = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as exc:
            raise UnsafePathError(f"{self.root}: cannot open the breaker directory ({exc.strerror}); it must be "
                                  "a real directory, not a symlink") from None
        try:
            problem = check_owned(os.fstat(root), uid=os.geteuid(), kind="directory")
            if problem is not None:
                raise UnsafePathError(f"{self.root}: {problem}; the breaker directory must belong to uid "
                                      f"{os.geteuid()} with no write for group or others (chown root; chmod 0755)")
            fd = open_owned_subdir(root, partition, where=str(self.root))
        finally:
            os.close(root)
        try:
            yield fd
        finally:
            os.close(fd)

    def _read(self, fd: int, name: str, where: str) -> BreakerSlot | None:
        try:
            handle = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise RecordError(where, f"cannot open: {exc.strerror}") from None
        with os.fdopen(handle, "rb") as f:
            data = f.read(64 * 1024)
        try:
            return BreakerSlot.from_json(json.loads(data), where)
        except (ValueError, UnicodeDecodeError):
            raise RecordError(where, "not JSON; remove it if no node holds this slot") from None

    def _mine(self, fd: int, partition: str) -> BreakerSlot | None:
        mine = self._read(fd, holder_name(self.node), f"{self.root}/{partition}/{holder_name(self.node)}")
        return mine if mine is not None and mine.node == self.node else None

    def claim(self, partition: str, cap: int, reason: str) -> Claim:
        """Take a free slot of `partition` (at most `cap` exist) for this node's drain, or say none is free."""
        with self._partition_dir(partition) as fd:
            taken = {name for name in os.listdir(fd) if name.startswith("slot-")}
            mine = self._mine(fd, partition)
            if mine is not None and mine.name in taken:
                return Claim(True, len(taken) - 1, mine, False)
            free = [i for i in range(cap) if slot_name(i) not in taken]
            self.shuffle(free)  # nodes claiming at once start at different slots
            tmp = f".claim-{self.node}-{os.urandom(4).hex()}"
            for index in free:
                record = BreakerSlot(self.node, partition, index, reason, self.now())
                handle = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=fd)
                try:
                    with os.fdopen(handle, "w", encoding="utf-8") as out:
                        out.write(json.dumps(record.to_json(), sort_keys=True) + "\n")
                        out.flush()
                        os.fsync(out.fileno())
                    try:
                        os.link(tmp, record.name, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
                    except FileExistsError:
                        taken.add(record.name)  # another node took it between our listing and now
                        continue
                    try:
                        os.unlink(holder_name(self.node), dir_fd=fd)  # a stale name of an earlier slot
                    except FileNotFoundError:
                        pass
                    os.link(tmp, holder_name(self.node), src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
                    os.fsync(fd)
                    return Claim(True, len(taken), record, True)
                finally:
                    try:
                        os.unlink(tmp, dir_fd=fd)
                    except FileNotFoundError:
                        pass
            return Claim(False, len(taken), None, False)

    def release(self, partition: str) -> BreakerSlot | None:
        """Give back the slot this node holds in `partition`; the slot given back, or None."""
        with self._partition_dir(partition) as fd:
            mine = self._mine(fd, partition)
            if mine is None:
                return None
            try:
                same = os.stat(mine.name, dir_fd=fd, follow_symlinks=False).st_ino == \
                    os.stat(holder_name(self.node), dir_fd=fd, follow_symlinks=False).st_ino
            except FileNotFoundError:
                same = False
            if same:  # never remove a slot an admin freed and another node took since
                os.unlink(mine.name, dir_fd=fd)
            os.unlink(holder_name(self.node), dir_fd=fd)
            os.fsync(fd)
            return mine

    def holds(self, partition: str) -> bool:
        """Whether this node holds a slot of `partition` (one lookup: no other slot is read)."""
        with self._partition_dir(partition) as fd:
            try:
                os.stat(holder_name(self.node), dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return False
            return True

    def slots(self, partition: str) -> tuple[list[BreakerSlot], list[str]]:
        """Every slot of `partition` with its holder, and the names of those that could not be read."""
        found: list[BreakerSlot] = []
        problems: list[str] = []
        with self._partition_dir(partition) as fd:
            for name in sorted(n for n in os.listdir(fd) if n.startswith("slot-")):
                try:
                    slot = self._read(fd, name, f"{self.root}/{partition}/{name}")
                except RecordError as exc:
                    problems.append(str(exc))
                    continue
                if slot is not None:
                    found.append(slot)
        return found, problems


LEDGER_ERRORS: tuple[type[BaseException], ...] = (UnsafePathError, RecordError, OSError)
"""What a ledger call raises when the directory is unusable (the caller falls back to Slurm's count)."""
