"""Neighbours watch each other: a node that stops beating is named by its neighbours within seconds,
whatever the job's size, and the agent blames it only when its own probe fails too."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from hypothesis import given, strategies as st

from clusterctl.launcher.job.node_probe import NodeProber, probe_once
from clusterctl.launcher.job.name_cache import NameCache
from clusterctl.launcher.job.peer_link import READ_PER_CALL, PeerLink
from clusterctl.launcher.pure.peer_watch import PEER_SILENT_SECONDS, PeerWatch, neighbours
from clusterctl.launcher.pure.reachability import PROBE_GAP_SECONDS, UNREACHABLE, ProbeResult, Probes, unreachable
from clusterctl.records.node_report import SilentPeer
from clusterctl.records.peer_beat import MAGIC, PeerBeat, decode_beat, encode_beat, parse_peer_port
from clusterctl.records.versioned import RecordError

KEY = bytes(range(32))
names = st.lists(st.from_regex(r"node[0-9]{1,5}", fullmatch=True), min_size=1, max_size=60, unique=True)


@given(names)
def test_every_node_of_a_step_of_three_or_more_is_watched_by_exactly_two_neighbours(nodes: list[str]) -> None:
    watchers = {node: [w for w in nodes if node in neighbours(nodes, w)] for node in nodes}
    expected = 0 if len(nodes) == 1 else 1 if len(nodes) == 2 else 2
    assert all(len(w) == expected for w in watchers.values())
    assert all(node not in neighbours(nodes, node) for node in nodes)


def test_a_node_not_in_the_step_watches_nobody() -> None:
    assert neighbours(["node1", "node2", "node3"], "node9") == ()


def test_a_neighbour_silent_two_and_a_half_seconds_is_named_and_one_never_heard_or_leaving_is_not() -> None:
    watch = PeerWatch(("node1", "node3")).heard("node1", 100.0).heard("node3", 100.0).heard("node7", 100.0)
    assert watch.silent(100.0 + PEER_SILENT_SECONDS - 0.1) == ()
    assert watch.silent(100.0 + PEER_SILENT_SECONDS) == (SilentPeer("node1", 2.5), SilentPeer("node3", 2.5))
    leaving = watch.heard("node3", 101.0, leaving=True)
    assert leaving.silent(110.0) == (SilentPeer("node1", 10.0),)
    assert PeerWatch(("node1",)).silent(1e6) == ()  # never heard: the agent's startup grace covers it


@given(st.builds(PeerBeat, st.from_regex(r"[0-9]{1,10}", fullmatch=True), st.from_regex(r"[0-9]{1,3}", fullmatch=True),
                 st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True), st.integers(0, 2**40), st.booleans()))
def test_a_beat_decodes_to_what_was_sent(beat: PeerBeat) -> None:
    assert decode_beat(encode_beat(beat, KEY), KEY, "beat") == beat


@pytest.mark.parametrize(("datagram", "said"), [
    (b"hello", "wrong magic"),
    (MAGIC + bytes(32) + b"{}", "not signed with this job's key"),
    (encode_beat(PeerBeat("1", "0", "node1", 1), bytes(32)), "not signed with this job's key"),
    (b"x" * 600, "at most 512"),
])
def test_a_datagram_from_outside_the_job_is_refused_saying_why(datagram: bytes, said: str) -> None:
    with pytest.raises(RecordError, match=said):
        decode_beat(datagram, KEY, "beat")


@pytest.mark.parametrize("text", ["", "80", "70000", "2e4", "-1"])
def test_a_wrong_peer_port_says_what_a_port_is(text: str) -> None:
    with pytest.raises(ValueError, match="is not a port number from 1024 to 65535"):
        parse_peer_port(text)


def test_two_reporters_links_hear_each_others_beats_and_drop_a_strangers() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    link = PeerLink(KEY, port, ["localhost"])
    try:
        for _ in range(200):  # the name is looked up off the loop: beats go once it is known
            if link.send(PeerBeat("1", "0", "node1", 7)) == 1:
                break
            time.sleep(0.01)
        stranger = PeerLink(bytes(32), 0, [])
        stranger.sock.sendto(encode_beat(PeerBeat("1", "0", "node9", 1), bytes(32)), ("127.0.0.1", port))
        stranger.close()
        got: list[PeerBeat] = []
        for _ in range(100):
            got += link.received()
            if got and link.refused:
                break
            time.sleep(0.01)
        assert got == [PeerBeat("1", "0", "node1", 7)] and link.refused == 1
    finally:
        link.close()


# ---- the agent's second witness: its own probe of the node ---------------------------------------------

def test_a_suspected_node_is_blamed_after_two_unanswered_probes_and_never_after_an_answer() -> None:
    suspected = {"node2": "its neighbour node1 has not heard its beats for 3.0 s"}
    probes = Probes().took(ProbeResult("node2", 10.0, False, "no answer within 1 s"))
    assert unreachable(suspected, probes) == []
    assert not probes.due("node2", 10.0 + PROBE_GAP_SECONDS / 2) and probes.due("node2", 10.0 + PROBE_GAP_SECONDS)
    twice = probes.took(ProbeResult("node2", 11.5, False, "no answer within 1 s"))
    (blame,) = unreachable(suspected, twice)
    assert blame.node == "node2" and blame.reason == UNREACHABLE
    assert "neighbour node1" in blame.evidence[0] and "last 2 probes of it went unanswered" in blame.evidence[1]
    answered = twice.took(ProbeResult("node2", 12.0, True, "port 6818 refused: the node is up"))
    assert unreachable(suspected, answered) == []
    unknown = Probes().took(ProbeResult("node2", 1, None, "does not resolve")).took(
        ProbeResult("node2", 2, None, "does not resolve"))
    assert unreachable(suspected, unknown) == []


@given(st.lists(st.sampled_from([True, False, None]), max_size=12))
def test_a_node_is_blamed_only_when_its_last_two_made_probes_went_unanswered(answers: list[bool | None]) -> None:
    probes = Probes()
    for at, answered in enumerate(answers):
        probes = probes.took(ProbeResult("node2", float(at), answered, "-"))
    made = [a for a in answers if a is not None]
    tail = 0
    for answer in reversed(made):
        if answer:
            break
        tail += 1
    assert bool(unreachable({"node2": "silent"}, probes)) == (tail >= 2)


def test_a_suspicion_that_ends_starts_its_count_again() -> None:
    probes = Probes().took(ProbeResult("node2", 1, False, "-")).forget(set())
    assert unreachable({"node2": "silent"}, probes.took(ProbeResult("node2", 2, False, "-"))) == []


def test_a_probe_of_a_listening_and_of_a_closed_port_says_the_node_is_up() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert probe_once("localhost", port)[0] is True
    up, how = probe_once("localhost", port)
    assert up is True and "refused" in how, how  # nothing listens, but the kernel answered
    assert probe_once("no-such-host.invalid", port)[0] is None


def test_the_prober_runs_each_probe_once_at_a_time_and_hands_back_its_result() -> None:
    import threading
    release = threading.Event()

    def slow(node: str, port: int) -> tuple[bool | None, str]:
        release.wait(5)
        return False, "no answer"

    prober = NodeProber(6818, lambda: 5.0, slow)
    assert prober.start("node2") and not prober.start("node2")
    release.set()
    for _ in range(500):
        done = prober.finished()
        if done:
            break
        time.sleep(0.01)
    assert done == [ProbeResult("node2", 5.0, False, "no answer")]


# ---- names looked up off the reporter's loop ----------------------------------------------------------

def test_a_resolver_that_hangs_never_holds_up_a_beat_and_the_beat_goes_once_the_name_resolves() -> None:
    answer, asked = threading.Event(), []

    def slow_dns(name: str) -> str:
        asked.append(name)
        answer.wait(10)  # a resolver that takes its time
        return "127.0.0.1"

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    link = PeerLink(KEY, port, ["node2"], names=NameCache(resolve=slow_dns))
    try:
        started = time.monotonic()
        assert link.send(PeerBeat("1", "0", "node1", 1)) == 0, "not known yet: skipped, not waited for"
        assert time.monotonic() - started < 5, "the beat waited for the resolver"
        answer.set()
        for _ in range(200):
            if link.send(PeerBeat("1", "0", "node1", 2)) == 1:
                break
            time.sleep(0.01)
        got: list[PeerBeat] = []
        for _ in range(100):
            got += link.received()
            if got:
                break
            time.sleep(0.01)
        assert [b.seq for b in got] == [2] and asked == ["node2"], "looked up once, then sent"
    finally:
        link.close()


def test_a_name_that_does_not_resolve_is_said_and_tried_again_only_after_the_retry_gap() -> None:
    now, asked = [100.0], []

    def no_such_host(name: str) -> str:
        asked.append(name)
        raise socket.gaierror(-2, "Name or service not known")

    names = NameCache(resolve=no_such_host, retry_seconds=5.0, clock=lambda: now[0])
    assert names.address("node9") is None
    for _ in range(200):
        if names.unresolved():
            break
        time.sleep(0.01)
    assert names.unresolved() == {"node9"}
    assert names.address("node9") is None and len(asked) == 1, "asked again before the retry gap"
    now[0] += 5.0
    names.address("node9")
    for _ in range(200):
        if len(asked) == 2:
            break
        time.sleep(0.01)
    assert asked == ["node9", "node9"]
    assert names.address("10.1.2.3") == "10.1.2.3", "an address is its own answer"


def test_a_flood_of_strangers_datagrams_costs_one_call_a_bounded_read() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    link = PeerLink(KEY, port, [])
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger:
            for _ in range(3 * READ_PER_CALL):
                stranger.sendto(b"junk" * 10, ("127.0.0.1", port))
        time.sleep(0.05)
        assert link.received() == [] and link.refused == READ_PER_CALL, "one call read past its bound"
        link.received()
        assert link.refused == 2 * READ_PER_CALL
    finally:
        link.close()
