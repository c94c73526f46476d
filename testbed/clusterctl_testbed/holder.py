"""The process that owns a testbed host's UTS and mount namespaces.

Started as `nsenter --net=<netns> unshare --uts --mount --propagation private
python -m clusterctl_testbed.holder --hostname node1 --bind SRC:DST ...`: it names the host,
bind-mounts the host's own files (/etc/hosts, /etc/slurm, ...), prints "ready" and
sleeps.  Daemons and commands join its namespaces with `nsenter -t <pid>`.

With `--root DIR` the host runs from a Debian root filesystem: /proc, /sys, /dev and /tmp
(where every testbed keeps its state) are mounted into DIR, every `--bind` target is taken
inside DIR, and the holder chroots into DIR; `nsenter --root` then puts whatever joins the
host in that root too.  With `--exec CMD...` (no --hostname) it runs CMD in that root instead
of sleeping: how the root filesystem's own Python installs the project.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path


def _mount(*argv: str) -> None:
    subprocess.run(["mount", *argv], check=True, timeout=10)


def _mount_point(target: Path, source: Path) -> None:
    # Mount points inside a root filesystem may be missing (a file for a file, a dir for a dir).
    if target.exists() or target.is_symlink():
        if target.is_symlink():
            target.unlink()
        else:
            return
    if source.is_dir():
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()


def enter_root(root: Path) -> None:
    """Mount the kernel's filesystems and the machine's /tmp into `root` (this namespace only)."""
    _mount("-t", "proc", "proc", str(root / "proc"))
    for path in ("/sys", "/dev", "/tmp"):
        _mount("--rbind", path, str(root / path.lstrip("/")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="clusterctl_testbed.holder")
    parser.add_argument("--hostname")
    parser.add_argument("--root", type=Path, help="run the host from this root filesystem")
    parser.add_argument("--bind", action="append", default=[], metavar="SRC:DST")
    argv = sys.argv[1:] if argv is None else argv
    # `--exec CMD...` ends the options: everything after it is the command, as given.
    command = argv[argv.index("--exec") + 1:] if "--exec" in argv else []
    if command[:1] == ["--"]:
        command = command[1:]
    args = parser.parse_args(argv[:argv.index("--exec")] if "--exec" in argv else argv)
    if args.hostname:
        socket.sethostname(args.hostname)
    if args.root is not None:
        enter_root(args.root)
    for spec in args.bind:
        src, dst = spec.split(":", 1)
        target = Path(dst)
        if args.root is not None:
            target = args.root / dst.lstrip("/")
            _mount_point(target, Path(src))
        _mount("--bind", src, str(target))
    if args.hostname:
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=10)
    if args.root is not None:
        os.chroot(args.root)
        os.chdir("/")
    if command:
        os.environ.pop("PYTHONPATH", None)  # it pointed this process at the testbed's code, not CMD
        os.execvp(command[0], command)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("ready", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
