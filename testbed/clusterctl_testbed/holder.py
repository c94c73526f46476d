"""The process that owns a testbed host's UTS and mount namespaces.

Started as `nsenter --net=<netns> unshare --uts --mount --propagation private
python -m testbed.holder --hostname node1 --bind SRC:DST ...`: it names the host,
bind-mounts the host's own files (/etc/hosts, /etc/slurm, ...), prints "ready" and
sleeps.  Daemons and commands join its namespaces with `nsenter -t <pid>`.
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="clusterctl_testbed.holder")
    parser.add_argument("--hostname", required=True)
    parser.add_argument("--bind", action="append", default=[], metavar="SRC:DST")
    args = parser.parse_args(argv)
    socket.sethostname(args.hostname)
    for spec in args.bind:
        src, dst = spec.split(":", 1)
        subprocess.run(["mount", "--bind", src, dst], check=True, timeout=10)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=10)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("ready", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
