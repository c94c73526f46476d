"""A shared mount that hangs, for one testbed node: a FUSE filesystem over a backing directory whose every
operation blocks while a switch file exists, as a Lustre or NFS client blocks when its server stops answering.

The mount is a real kernel mount (FUSE: the kernel waits for this process's answer as it would for a server
over the network), made in the node's own mount namespace, so only that node sees it hang; healthd's storage
probe (write, fsync, read, unlink) then blocks in the kernel exactly as on a hung Lustre client.  While the
switch file exists, every operation waits; removing it lets the waiting ones finish, as a server that comes
back does.  Only the mount's root directory's own attributes answer at once (the kernel asks for them to
mount it, and a hung real mount still shows in `mount`).

    python -m clusterctl_testbed.hung_mount BACKING MOUNTPOINT SWITCH   (in the node's namespaces; foreground)

Needs libfuse 3 (Debian's fuse3) and mfusepy (the testbed's extra); the testbed's other parts do not.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from pathlib import Path
from typing import Any

POLL_SECONDS = 0.05
"""How often a blocked operation looks whether the switch is gone: a server coming back is seen this soon."""


def _fuse() -> Any:
    try:
        import mfusepy
    except (ImportError, OSError) as exc:  # OSError: mfusepy found no libfuse
        raise SystemExit(f"hung_mount: needs mfusepy and libfuse 3 (apt-get install fuse3): {exc}") from None
    return mfusepy


def make_filesystem(backing: Path, switch: Path, fuse: Any) -> Any:
    """The FUSE operations: the backing directory's, each first waiting while `switch` exists."""

    class HangingPassthrough(fuse.Operations):  # type: ignore[misc, name-defined]
        use_ns = True  # utimens gets nanoseconds (mfusepy's floats are deprecated)

        def __init__(self) -> None:
            self.root = str(backing)

        def _path(self, path: str) -> str:
            return os.path.join(self.root, path.lstrip("/"))

        def _wait(self) -> None:
            while switch.exists():
                time.sleep(POLL_SECONDS)

        def _call(self, function: Any, *args: Any) -> Any:
            self._wait()
            try:
                return function(*args)
            except OSError as exc:
                raise fuse.FuseOSError(exc.errno or errno.EIO) from None

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            if path != "/":
                self._wait()
            try:
                st = os.lstat(self._path(path))
            except OSError as exc:
                raise fuse.FuseOSError(exc.errno or errno.EIO) from None
            return {key: getattr(st, key) for key in ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime",
                                                       "st_nlink", "st_size", "st_uid")}

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", *self._call(os.listdir, self._path(path))]

        def create(self, path: str, mode: int, fi: Any = None) -> int:
            return int(self._call(os.open, self._path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode))

        def open(self, path: str, flags: int) -> int:
            return int(self._call(os.open, self._path(path), flags))

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            return bytes(self._call(os.pread, fh, size, offset))

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            return int(self._call(os.pwrite, fh, data, offset))

        def truncate(self, path: str, length: int, fh: int | None = None) -> None:
            self._call(os.truncate, self._path(path), length)

        def fsync(self, path: str, datasync: int, fh: int) -> None:
            self._call(os.fsync, fh)

        def flush(self, path: str, fh: int) -> None:
            self._wait()

        def release(self, path: str, fh: int) -> None:
            os.close(fh)  # never waits: the kernel does not wait for a release's answer

        def unlink(self, path: str) -> None:
            self._call(os.unlink, self._path(path))

        def mkdir(self, path: str, mode: int) -> None:
            self._call(os.mkdir, self._path(path), mode)

        def rmdir(self, path: str) -> None:
            self._call(os.rmdir, self._path(path))

        def rename(self, old: str, new: str) -> None:
            self._call(os.rename, self._path(old), self._path(new))

        def chmod(self, path: str, mode: int) -> None:
            self._call(os.chmod, self._path(path), mode)

        def utimens(self, path: str, times: tuple[int, int] | None = None) -> None:
            self._wait()
            try:
                os.utime(self._path(path), ns=times) if times else os.utime(self._path(path))
            except OSError as exc:
                raise fuse.FuseOSError(exc.errno or errno.EIO) from None

        def statfs(self, path: str) -> dict[str, int]:
            st = self._call(os.statvfs, self._path(path))
            return {key: getattr(st, key) for key in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                                       "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

    return HangingPassthrough()


def main(argv: list[str] | None = None) -> int:
    """Serve the mount in the foreground until it is unmounted (or this process is ended)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m clusterctl_testbed.hung_mount BACKING MOUNTPOINT SWITCH", file=sys.stderr)
        return 2
    backing, mountpoint, switch = (Path(a) for a in args)
    fuse = _fuse()
    # Multithreaded: a blocked operation must not keep the kernel's other requests (the root's attributes,
    # the unmount) from being answered.
    fuse.FUSE(make_filesystem(backing, switch, fuse), str(mountpoint), foreground=True, nothreads=False,
              allow_other=True, default_permissions=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
