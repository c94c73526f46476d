"""Benchmark the report socket and the copy server under abuse (issue 40): what a stranger costs the job.

    sudo .venv/bin/python bench/abuse_bench.py [--trials 5] [--seconds 5] [--nodes 12500] [--part inbox|copy|both]
        [--json PATH]

(a) inbox: the agent's real `ReportInbox` on 127.0.0.1, drained as the agent's loop does (one `drain()`, then
    STEP_POLL_SECONDS asleep).  Honest load: one sender process standing for --nodes reporters on a 20 s heartbeat
    (12,500: 625 real signed 8-rank reports a second, ~1.6 KB each, node names cycling over 12,500; each carries its send
    time).  Each trial runs --seconds quiet, then --seconds with a flooder beside it: another process (as
    `nobody` when run as root: another user on the node) sending 1,400-byte datagrams with the report magic and
    a wrong signature (the costliest refusal: HMAC over the whole body) as fast as one process can on loopback
    (its own line rate), for exactly --seconds.  Measured, per phase: the CPU of the agent's thread inside
    `drain()` as a share of one core (thread_time), the longest single drain (how long the loop stood still),
    datagrams refused a second, and the honest reports: the share the agent consumed (the rest the kernel
    dropped from a full queue: each is replaced by the node's next report) and the latency from their send to
    the drain that returned them (detection latency: a reporter sends at once on a change).
(b) copy: the real `CopyServer` (1 MiB copy) with N strangers connected from 127.0.0.2 before the job's
    push from 127.0.0.1: idle (they read the greeting and say nothing) or slow-loris (a byte every 0.5 s).
    Measured: the time from the first push attempt until the copy is kept, retrying on BUSY every 0.1 s as a
    node would, given up after 10 s.

Every figure: median [min-max] over --trials.  Run it against older code by copying this file into an older
checkout and running it there (PYTHONPATH at that checkout).  Writes bench/results/abuse.json (or --json).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clusterctl.checkpoint.copies import MANIFEST_NAME, shards_of  # noqa: E402
from clusterctl.checkpoint.transport import CopyServer, TransferError, copy_dir_name, push_copy  # noqa: E402
from clusterctl.launcher.job.report_channel import ReportInbox  # noqa: E402
from clusterctl.launcher.job.step_watch import STEP_POLL_SECONDS  # noqa: E402
from clusterctl.records.checkpoint_manifest import CheckpointManifest, write_checkpoint_manifest  # noqa: E402
from clusterctl.records.node_report import MAGIC, NodeHealth, NodeReport, RankBeat, encode  # noqa: E402
from clusterctl.records.rank_progress import RankProgress  # noqa: E402

KEY = bytes(range(32))
NODES = 12_500
"""Reporters the honest sender stands for (--nodes)."""
HEARTBEAT = 20.0
RANKS_PER_NODE = 8
STRANGER = 65534
GIVE_UP = 10.0


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def fmt(s: dict[str, float], scale: float = 1.0, digits: int = 3, unit: str = "") -> str:
    def one(v: float) -> str:
        return f"{v * scale:.{digits}g}"
    return f"{one(s['median'])}{unit} [{one(s['min'])}-{one(s['max'])}]"


def become_stranger() -> None:
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(STRANGER)
        os.setuid(STRANGER)


# ---- (a) the report inbox ---------------------------------------------------------------------------------

def report(index: int, seq: int, now: float) -> NodeReport:
    node = f"gpu{index + 1:05d}"
    first = index * RANKS_PER_NODE
    ranks = tuple(RankBeat(RankProgress(r, node, 1000 + seq, "step", now, 20_000 + r % 8, 400.0, 1000, now))
                  for r in range(first, first + RANKS_PER_NODE))
    return NodeReport("7", "0", node, seq, now, ranks, NodeHealth("ok", (), now))


def honest_sender(port: int, nodes: int, stop: Any, sent: Any) -> None:
    """`nodes` / HEARTBEAT reports a second, in batches every 20 ms, each stamped as sent."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rate, tick, index, seq = nodes / HEARTBEAT, 0.02, 0, 0
    due = time.monotonic()
    carry = 0.0
    while not stop.is_set():
        carry += rate * tick
        while carry >= 1:
            carry -= 1
            seq += 1
            try:
                sock.sendto(encode(report(index, seq, time.time()), KEY), ("127.0.0.1", port))
                with sent.get_lock():
                    sent.value += 1
            except OSError:
                pass
            index = (index + 1) % nodes
        due += tick
        time.sleep(max(0.0, due - time.monotonic()))


def flooder(port: int, seconds: float, sent: Any) -> None:
    """Junk with the report magic and a wrong signature, as fast as one process sends, for `seconds`."""
    become_stranger()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    junk = MAGIC + bytes(32) + os.urandom(1400 - 36)
    stop, count = time.monotonic() + seconds, 0
    while time.monotonic() < stop:
        for _ in range(256):
            try:
                sock.sendto(junk, ("127.0.0.1", port))
                count += 1
            except OSError:
                pass
    sent.value = count


def agent_phase(inbox: ReportInbox, seconds: float, sent: Any) -> dict[str, float]:
    """The agent's loop for `seconds` (at least until its last drain returns): drain, then sleep."""
    refused0, sent0 = sum(inbox.refused.values()), sent.value
    cpu, longest, latencies = 0.0, 0.0, []
    start = time.monotonic()
    end = start + seconds
    while time.monotonic() < end:
        t0, c0 = time.monotonic(), time.thread_time()
        reports = inbox.drain()
        cpu += time.thread_time() - c0
        longest = max(longest, time.monotonic() - t0)
        now = time.time()
        latencies += [now - r.sent_at for r in reports]
        time.sleep(STEP_POLL_SECONDS)
    wall = time.monotonic() - start
    honest_sent = sent.value - sent0
    return {"cpu_share": cpu / wall, "longest_drain_s": longest,
            "refused_per_s": (sum(inbox.refused.values()) - refused0) / wall,
            "delivered": len(latencies) / honest_sent if honest_sent else 0.0,
            "latency_median_s": statistics.median(latencies) if latencies else float("nan"),
            "latency_p99_s": sorted(latencies)[int(0.99 * (len(latencies) - 1))] if latencies else float("nan")}


def inbox_trials(trials: int, seconds: float, nodes: int) -> dict[str, Any]:
    inbox = ReportInbox(KEY, "127.0.0.1")
    stop, sent = mp.Event(), mp.Value("q", 0)
    sender = mp.Process(target=honest_sender, args=(inbox.port, nodes, stop, sent), daemon=True)
    sender.start()
    out: dict[str, list[dict[str, float]]] = {"quiet": [], "flood": []}
    flood_rates: list[float] = []
    try:
        time.sleep(1.0)
        inbox.drain()  # what queued while the sender started
        for trial in range(trials):
            out["quiet"].append(agent_phase(inbox, seconds, sent))
            flooded = mp.Value("q", 0)
            flood = mp.Process(target=flooder, args=(inbox.port, seconds, flooded), daemon=True)
            flood.start()
            out["flood"].append(agent_phase(inbox, seconds, sent))
            flood.join()
            flood_rates.append(flooded.value / seconds)
            settle = time.monotonic() + 1.0
            while time.monotonic() < settle:  # the flood's leftovers, as the agent would read them
                inbox.drain()
                time.sleep(STEP_POLL_SECONDS)
            say(f"(a) trial {trial + 1}: quiet {out['quiet'][-1]}, flood {out['flood'][-1]} "
                f"({flood_rates[-1]:,.0f} junk/s sent)")
    finally:
        stop.set()
        sender.join(5)
        inbox.close()
    return {phase: {k: spread([t[k] for t in rows]) for k in rows[0]} for phase, rows in out.items()} | {
        "flood_sent_per_s": spread(flood_rates), "drain_bounded": hasattr(inbox, "cut_short")}


# ---- (b) the copy server ------------------------------------------------------------------------------------

def a_copy(root: Path) -> tuple[Path, CheckpointManifest]:
    copy = root / "local" / copy_dir_name(40)
    copy.mkdir(parents=True, exist_ok=True)
    (copy / "model.bin").write_bytes(os.urandom(1 << 20))
    manifest = CheckpointManifest(step=40, of_node="node3", tier="local", held_on="node3", shards=shards_of(copy),
                                  written_at=1_700_000_000.0, save_seconds=1.0, slot=3, slots=4)
    write_checkpoint_manifest(copy / MANIFEST_NAME, manifest)
    return copy, manifest


def strangers(port: int, count: int, loris: bool, stop: Any) -> None:
    """`count` connections from 127.0.0.2 that say nothing (or, `loris`, a byte every 0.5 s), kept open
    (reconnecting when dropped) until `stop`."""
    become_stranger()
    socks: list[socket.socket | None] = [None] * count
    while not stop.is_set():
        for i in range(count):
            if socks[i] is None:
                try:
                    socks[i] = socket.create_connection(("127.0.0.1", port), timeout=1,
                                                        source_address=("127.0.0.2", 0))
                except OSError:
                    continue
            if loris:
                try:
                    socks[i].sendall(b"x")  # type: ignore[union-attr]
                except OSError:
                    socks[i].close()  # type: ignore[union-attr]
                    socks[i] = None
        stop.wait(0.5)


def push_time(port: int, copy: Path, manifest: CheckpointManifest) -> float:
    start = time.monotonic()
    while True:
        try:
            push_copy("127.0.0.1", port, KEY, copy, manifest, timeout=GIVE_UP)
            return time.monotonic() - start
        except TransferError as exc:
            if not exc.retryable and "busy" not in str(exc) or time.monotonic() - start > GIVE_UP:
                return float("inf")
            time.sleep(0.1)


def copy_trials(trials: int) -> dict[str, Any]:
    cases = [("none", 0, False), ("4 idle", 4, False), ("16 slow-loris", 16, True)]
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        copy, manifest = a_copy(Path(tmp) / "node3")
        for label, count, loris in cases:
            times: list[float] = []
            for trial in range(trials):
                server = CopyServer(Path(tmp) / f"node1-{label}-{trial}".replace(" ", "-"), "node1", KEY, 0,
                                    "127.0.0.1").start()
                stop = mp.Event()
                crowd = mp.Process(target=strangers, args=(server.port, count, loris, stop), daemon=True)
                crowd.start()
                time.sleep(1.0 if count else 0.0)  # the strangers are in
                try:
                    times.append(push_time(server.port, copy, manifest))
                finally:
                    stop.set()
                    crowd.join(5)
                    refused = getattr(server, "refused", None)
                    server.close()
            result[label] = spread(times) | {"gave_up": sum(t == float("inf") for t in times),
                                             "refused_last_trial": refused}
            say(f"(b) {label}: {result[label]}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--nodes", type=int, default=NODES)
    parser.add_argument("--part", choices=("inbox", "copy", "both"), default="both")
    parser.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "results" / "abuse.json")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"trials": args.trials, "seconds": args.seconds, "cpus": os.cpu_count(),
                              "load_before": os.getloadavg()[0]}
    if args.part in ("inbox", "both"):
        result["inbox"] = inbox_trials(args.trials, args.seconds, args.nodes)
        a = result["inbox"]
        for phase in ("quiet", "flood"):
            p = a[phase]
            print(f"| inbox, {phase} | {fmt(p['cpu_share'], 100, 3, '%')} | {fmt(p['longest_drain_s'], 1000, 3)} ms | "
                  f"{fmt(p['refused_per_s'], 1, 3)} | {fmt(p['delivered'], 100, 3, '%')} | "
                  f"{fmt(p['latency_median_s'], 1000, 3)} ms | {fmt(p['latency_p99_s'], 1000, 3)} ms |")
        print(f"junk sent per s: {fmt(a['flood_sent_per_s'])}")
    if args.part in ("copy", "both"):
        result["copy"] = copy_trials(args.trials)
        for label, c in result["copy"].items():
            print(f"| copy, {label} | {fmt(c, 1000, 3)} ms | gave up {c['gave_up']} of {args.trials} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
