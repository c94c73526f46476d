"""Benchmark the neighbours' watch: false "dead" verdicts under packet loss and on a loaded node, and its cost.

    sudo .venv/bin/python bench/peer_watch_bench.py [--nodes 12500] [--hours 1] [--loss 0.01] [--trials 5] \\
        [--probes 2000] [--loaded-seconds 60] [--json PATH]

A node is blamed `unreachable` (launcher/pure/reachability.py) only when it is *suspected* (a neighbour
has not heard its beats for PEER_SILENT_SECONDS, launcher/pure/peer_watch.py) and then two of the
agent's probes in a row go unanswered.  A false swap needs both on a healthy node; this bench measures
each with the real component and multiplies:

  (a) loss: suspicions of healthy nodes when every beat is lost with probability --loss, independently:
      --nodes nodes on the ring (two watchers each), --hours of beats every PEER_BEAT_SECONDS.  SIMULATED:
      the network (which beats are lost: one draw per beat, numpy, seeded per trial).  REAL: each watcher's
      `PeerWatch`, told every beat that arrives around a run of losses and asked `silent()` when the next
      beat is due, as the reporter asks it every 0.25 s (only runs of losses long enough to matter are
      replayed through it; a shorter run cannot make a verdict: asserted on the first trial by replaying
      one watcher's whole hour).
  (b) probe: the agent's real probe (`node_probe.probe_once`, 1 s timeout) of a node that is up, --probes
      times per trial, across a real veth link between two network namespaces with --loss of the packets
      into each end dropped (iptables' statistic match) (a lost SYN is retransmitted after Linux's 1 s: then the probe has no answer).
      Counted: unanswered probes, and two unanswered in a row (what blames a suspected node).
  (c) loaded: the real beat path (`PeerLink` sending a `PeerBeat` every PEER_BEAT_SECONDS from a loop that
      ticks every 0.25 s, as the reporter's does) on a machine whose every core runs a busy loop (100% CPU,
      same priority), heard by a real `PeerLink` + `PeerWatch` in another process: the longest gap between
      beats and the `silent()` verdicts over --loaded-seconds per trial.

False swaps per hour at --nodes = suspicions per hour (a, c) x P(two unanswered probes) (b).  Per node it
costs 8 datagrams a second (4 out, 4 in, ~150 bytes each), nothing on slurmctld or shared storage.
Writes bench/results/peer_watch.json (or --json).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clusterctl.launcher.job.peer_link import PeerLink  # noqa: E402
from clusterctl.launcher.pure.peer_watch import PEER_BEAT_SECONDS, PEER_SILENT_SECONDS, PeerWatch  # noqa: E402
from clusterctl.records.peer_beat import PeerBeat, encode_beat  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
KEY = os.urandom(32)
TICK = 0.25
"""The reporter's loop: it asks its PeerWatch once a tick."""


def spread(values: list[float]) -> dict[str, float]:
    """Median, min and max."""
    return {"median": round(statistics.median(values), 6), "min": round(min(values), 6), "max": round(max(values), 6)}


# ---- (a) suspicions of healthy nodes under random loss ---------------------------------------------------

def suspicions_in(lost: np.ndarray, watch: PeerWatch, peer: str) -> int:
    """Replay one watcher's beats of `peer` (lost[i]: beat i lost) through the real PeerWatch around each
    run of losses; the number of distinct silences it names."""
    named = 0
    beats = len(lost)
    # Runs of losses: where a kept beat is followed by a lost one, and back.
    edges = np.flatnonzero(np.diff(np.concatenate(([0], lost.astype(np.int8), [0]))))
    starts, ends = edges[0::2], edges[1::2]  # lost beats [start, end)
    shortest = int(PEER_SILENT_SECONDS / PEER_BEAT_SECONDS) - 1  # fewer lost in a row cannot reach the limit
    for start, end in zip(starts, ends):
        if end - start < shortest or start == 0:
            continue
        heard = (start - 1) * PEER_BEAT_SECONDS
        watch = watch.heard(peer, heard)
        silent_once = False
        at = heard
        back = end * PEER_BEAT_SECONDS if end < beats else beats * PEER_BEAT_SECONDS
        while at + TICK < back:  # the reporter hears the next beat before it asks at that tick
            at += TICK
            if not silent_once and watch.silent(at):
                silent_once = True
        named += silent_once
    return named


def full_replay(lost: np.ndarray, peer: str) -> int:
    """The same watcher's hour beat by beat, tick by tick, through the real PeerWatch (the check)."""
    watch, named, silent_before = PeerWatch((peer,)), 0, False
    for i, gone in enumerate(lost):
        at = i * PEER_BEAT_SECONDS
        if not gone:
            watch = watch.heard(peer, at)
        for tick in (at, at + TICK):
            silent = bool(watch.silent(tick))
            named += silent and not silent_before
            silent_before = silent
    return named


def loss_trial(nodes: int, hours: float, loss: float, seed: int, check: bool) -> dict[str, float]:
    """Suspicions of `nodes` healthy nodes (two watchers each) over `hours` at `loss`."""
    rng = np.random.default_rng(seed)
    beats = int(hours * 3600 / PEER_BEAT_SECONDS)
    pairs, named, started = 2 * nodes, 0, time.process_time()
    chunk = 500
    for first in range(0, pairs, chunk):
        lost = rng.random((min(chunk, pairs - first), beats)) < loss
        for row in lost:
            named += suspicions_in(row, PeerWatch(("peer",)), "peer")
        if check and first == 0:
            row = lost[0]
            assert suspicions_in(row, PeerWatch(("peer",)), "peer") == full_replay(row, "peer"), "replay differs"
    return {"suspicions": named, "pairs": pairs, "beats_per_pair": beats,
            "cpu_s": round(time.process_time() - started, 2)}


# ---- (b) the agent's probe across a lossy link -------------------------------------------------------

NETNS = ("pwb-agent", "pwb-node")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def lossy_link(loss: float) -> None:
    """Two network namespaces joined by a veth pair, 10.98.0.1 (the agent) and .2 (the node), each end
    losing `loss` of the packets it receives."""
    link_down()
    for ns in NETNS:
        _ip("netns", "add", ns)
    _ip("link", "add", "pwb-a", "netns", NETNS[0], "type", "veth", "peer", "name", "pwb-n", "netns", NETNS[1])
    for ns, dev, addr in ((NETNS[0], "pwb-a", "10.98.0.1/24"), (NETNS[1], "pwb-n", "10.98.0.2/24")):
        _ip("-n", ns, "addr", "add", addr, "dev", dev)
        _ip("-n", ns, "link", "set", dev, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        # Every packet into each namespace dropped with probability `loss` (iptables' statistic match:
        # tc's netem is not in every kernel), so a probe's SYN and its answer are each lost at `loss`.
        subprocess.run(["ip", "netns", "exec", ns, "iptables", "-A", "INPUT", "-m", "statistic", "--mode", "random",
                        "--probability", f"{loss:g}", "-j", "DROP"], check=True, capture_output=True)


def link_down() -> None:
    for ns in NETNS:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def probe_trial(count: int, port: int = 6818) -> dict[str, float]:
    """`count` probes from the agent's namespace of a node whose port listens, one after another."""
    script = (
        "import sys, time, json\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from clusterctl.launcher.job.node_probe import probe_once\n"
        "answers = []\n"
        f"for _ in range({count}):\n"
        f"    answers.append(probe_once('10.98.0.2', {port})[0])\n"
        "print(json.dumps(answers))\n"
    )
    server = subprocess.Popen(["ip", "netns", "exec", NETNS[1], sys.executable, "-c",
                               "import socket, time\n"
                               "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                               f"s.bind(('0.0.0.0', {port})); s.listen(4096)\n"
                               "while True:\n    c, _ = s.accept(); c.close()\n"])
    try:
        time.sleep(0.5)
        done = subprocess.run(["ip", "netns", "exec", NETNS[0], sys.executable, "-c", script], check=True,
                              capture_output=True, text=True)
    finally:
        server.kill()
        server.wait()
    answers = json.loads(done.stdout)
    unanswered = sum(1 for a in answers if a is False)
    twice = sum(1 for a, b in zip(answers, answers[1:]) if a is False and b is False)
    return {"probes": len(answers), "unanswered": unanswered, "unanswered_twice": twice,
            "not_made": sum(1 for a in answers if a is None)}


# ---- (c) a node at 100% CPU ------------------------------------------------------------------------------

def _burn(stop_at: float) -> None:
    while time.monotonic() < stop_at:
        pass


def _beater(port: int, seconds: float) -> None:
    """The reporter's beat loop: a tick every 0.25 s, a beat every PEER_BEAT_SECONDS, through a real PeerLink."""
    link = PeerLink(KEY, 0, ["127.0.0.1"], send_port=port)
    end, seq, next_beat = time.monotonic() + seconds, 0, 0.0
    while time.monotonic() < end:
        now = time.monotonic()
        if now >= next_beat:
            seq += 1
            link.send(PeerBeat("1", "0", "node7", seq))
            next_beat = now + PEER_BEAT_SECONDS
        time.sleep(TICK)
    link.close()


def loaded_trial(seconds: float) -> dict[str, float]:
    """Beats from a loaded machine heard by a real PeerLink + PeerWatch ticking like the reporter."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    watcher = PeerLink(KEY, port, ["node7"])
    stop_at = time.monotonic() + seconds + 1.0
    burners = [multiprocessing.Process(target=_burn, args=(stop_at,)) for _ in range(2 * (os.cpu_count() or 1))]
    for burner in burners:
        burner.start()
    beater = multiprocessing.Process(target=_beater, args=(port, seconds))
    beater.start()
    watch, heard_at, gaps, verdicts, silent_before = PeerWatch(("node7",)), [], [], 0, False
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            now = time.monotonic()
            for beat in watcher.received():
                watch = watch.heard(beat.node, now)
                heard_at.append(now)
            silent = bool(watch.silent(now))
            verdicts += silent and not silent_before
            silent_before = silent
            time.sleep(TICK)
    finally:
        beater.join(seconds + 10)
        for burner in burners:
            burner.join(5)
        watcher.close()
    gaps = [b - a for a, b in zip(heard_at, heard_at[1:])]
    return {"beats": len(heard_at), "longest_gap_s": round(max(gaps), 3) if gaps else float("nan"),
            "silent_verdicts": verdicts, "busy_loops": len(burners)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=12_500)
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--loss", type=float, default=0.01)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--probes", type=int, default=2000)
    parser.add_argument("--loaded-seconds", type=float, default=60.0)
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "peer_watch.json")
    args = parser.parse_args(argv)
    if args.nodes < 2 or args.hours <= 0 or not 0 <= args.loss < 1 or args.trials < 1 or args.probes < 2:
        parser.error("--nodes ≥ 2, --hours > 0, 0 ≤ --loss < 1, --trials ≥ 1, --probes ≥ 2")
    if os.geteuid() != 0:
        parser.error("the probe part makes network namespaces and a lossy link: run it as root")
    result: dict[str, object] = {"nodes": args.nodes, "hours": args.hours, "loss": args.loss,
                                 "beat_bytes": len(encode_beat(PeerBeat("1234567", "3", "gpu12345", 123456), KEY)),
                                 "datagrams_per_node_per_s": 2 * 2 / PEER_BEAT_SECONDS}
    losses = [loss_trial(args.nodes, args.hours, args.loss, seed, check=seed == 0) for seed in range(args.trials)]
    print(f"(a) loss {args.loss:.0%}, {args.nodes} nodes x 2 watchers, {args.hours:g} h: suspicions "
          f"{[t['suspicions'] for t in losses]}", flush=True)
    lossy_link(args.loss)
    try:
        probes = [probe_trial(args.probes) for _ in range(args.trials)]
    finally:
        link_down()
    print(f"(b) probes across {args.loss:.0%} loss: unanswered {[p['unanswered'] for p in probes]} of "
          f"{args.probes}; twice in a row {[p['unanswered_twice'] for p in probes]}", flush=True)
    loaded = [loaded_trial(args.loaded_seconds) for _ in range(args.trials)]
    print(f"(c) 100% CPU: longest gap {[t['longest_gap_s'] for t in loaded]} s; silent verdicts "
          f"{[t['silent_verdicts'] for t in loaded]}", flush=True)
    made = sum(p["probes"] for p in probes)
    p_twice = sum(p["unanswered_twice"] for p in probes) / max(1, made - len(probes))
    suspicions_per_hour = statistics.median(t["suspicions"] for t in losses) / args.hours
    result |= {"loss_trials": losses, "probe_trials": probes, "loaded_trials": loaded,
               "summary": {"suspicions_per_hour": suspicions_per_hour,
                           "p_unanswered": spread([p["unanswered"] / p["probes"] for p in probes]),
                           "p_unanswered_twice": p_twice,
                           "loaded_longest_gap_s": spread([t["longest_gap_s"] for t in loaded]),
                           "loaded_silent_verdicts": sum(t["silent_verdicts"] for t in loaded),
                           "false_swaps_per_hour": suspicions_per_hour * p_twice}}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
