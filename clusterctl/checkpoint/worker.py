"""Local rank 0's background work for the node's tier: the copy server, and a thread whose every round
(`tend`) commits the saves every local rank finished, pushes the newest new copy to the buddy, flushes
the due ones to shared storage, applies retention and rewrites holdings.json; at the end (`close`) the
last round, the flush at the end and, when training is done, the tier emptied."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from clusterctl.checkpoint.copies import MANIFEST_NAME, CopyError
from clusterctl.checkpoint.flush import Throttle, flush_copy
from clusterctl.checkpoint.link import CopyLink, CopyService
from clusterctl.checkpoint.place import RankPlace, TierHold, Voice
from clusterctl.checkpoint.save import Saver, committer_marker
from clusterctl.checkpoint.tier import flush_due, shared_copy_dir
from clusterctl.records.checkpoint_holdings import CopyRefusals
from clusterctl.records.checkpoint_manifest import CheckpointManifest, read_checkpoint_manifest
from clusterctl.records.tier_index import NONE
from clusterctl.records.versioned import RecordError

POLL_SECONDS = 0.2
"""How often local rank 0's thread looks for a newly committed copy (node-local tmpfs: a free listing)."""
PUSH_RETRY_SECONDS = 5.0
"""After a buddy refused a push (no server yet, or busy), the next try comes this much later."""
REFUSALS_EVERY = 5.0
"""The copy server's refusals go into holdings.json at most this often (they ride the reporter's heartbeat):
a flood of strangers costs the node one small rewrite on its tmpfs per interval, not one per connection."""


class TierWorker:
    """Local rank 0's copy server and background thread (see the module docstring); `saver` commits
    the node's saves in each round."""

    def __init__(self, place: RankPlace, hold: TierHold, voice: Voice, link: CopyLink, saver: Saver) -> None:
        self._place, self._hold, self._voice, self._link, self._saver = place, hold, voice, link, saver
        self._stop = threading.Event()
        self._handled: set[int] = set()
        self._pushed: set[int] = set()
        self._next_push = 0.0
        self._flushed: set[int] = set()
        self._server: CopyService | None = None
        self._thread: threading.Thread | None = None
        self._serving_since = 0.0
        self._next_refusals = 0.0

    def start(self, poll_seconds: float | None) -> None:
        """Serve the node's copies and, unless `poll_seconds` is None (then whoever drives the worker
        calls `tend()`), start the thread that tends the tier every `poll_seconds`."""
        tier = self._hold.tier
        assert tier is not None
        # From here on local rank 0's thread (or whoever calls tend()) commits the node's saves.
        committer_marker(tier.root, self._place.attempt).touch(mode=0o600)
        try:
            self._serving_since = time.time()
            self._server = self._link.serve(tier.root, self._place.node, self._received)
            with self._hold.lock:
                self._hold.serving, self._hold.refused = True, None  # an earlier step's server's count is over
        except Exception as exc:  # no server: this node's copies cannot be fetched, training goes on
            self._voice.say_once("serve", f"cannot serve copies on port {self._link.port}: {exc}; other nodes "
                                          "cannot fetch this node's copies")
        # Copies from before this step: the newest is sent to the (maybe new) buddy again and flushed
        # when due and not on shared storage yet; older ones were dealt with then.
        self._handled.update(m.step for _, m in tier.local_copies()[:-1])
        if poll_seconds is not None:
            self._thread = threading.Thread(target=self._run, args=(poll_seconds,), name="clusterctl-checkpoint",
                                            daemon=True)
            self._thread.start()

    def _run(self, poll_seconds: float) -> None:
        while not self._stop.wait(poll_seconds):
            self.tend()

    def tend(self) -> None:
        """See Checkpointer.tend."""
        tier = self._hold.tier
        if tier is None:
            return
        settings = self._place.settings
        try:
            self._saver.commit_ready()
            copies = tier.local_copies()
            new = [(path, m) for path, m in copies if m.step not in self._handled]
            # Only the newest goes to the buddy: when saves outpace the network, older ones are moot.
            if copies and copies[-1][1].step not in self._pushed and time.monotonic() >= self._next_push:
                self._push(*copies[-1])
            for path, manifest in new:
                if flush_due(manifest.step, settings.flush_every_steps) and not self._on_shared(manifest):
                    self._flush(path, manifest)
            self._handled.update(m.step for _, m in new)
            with self._hold.lock:
                if new:
                    tier.apply_retention(settings.keep)
                self._note_refusals()
                self._hold.rewrite_holdings()
        except Exception as exc:  # the contract: never break training; the next round tries again
            self._voice.say_once("tend", f"checkpoint background work failed ({type(exc).__name__}: {exc}); "
                                         "it is tried again")

    def _note_refusals(self) -> None:
        """What the copy server turned away, into the holdings at most every REFUSALS_EVERY s.  The caller
        holds the hold's lock."""
        if self._server is None or time.monotonic() < self._next_refusals:
            return
        self._next_refusals = time.monotonic() + REFUSALS_EVERY
        self._hold.refused = CopyRefusals.of(self._serving_since, self._server.refused)

    def _on_shared(self, manifest: CheckpointManifest) -> bool:
        """Whether this copy is on shared storage already: flushed by this node, or the copy a resume
        staged from (its shards are there, the same ones)."""
        if manifest.step in self._flushed:
            return True
        try:
            shared = read_checkpoint_manifest(shared_copy_dir(self._place.shared_dir, manifest.step, self._place.slot)
                                              / MANIFEST_NAME)
        except (OSError, RecordError):
            return False
        if shared.shards != manifest.shards:
            return False  # an older save of the same step, before a resume from an earlier one
        self._flushed.add(manifest.step)
        return True

    def _flush(self, path: Path, manifest: CheckpointManifest) -> None:
        tier = self._hold.tier
        assert tier is not None
        try:
            shared = flush_copy(path, manifest, self._place.shared_dir, self._place.slot,
                                Throttle(self._place.settings.shared_bytes_per_second))
        except (CopyError, OSError) as exc:
            self._voice.say_once("flush", f"cannot flush step {manifest.step} to shared storage: {exc}")
            return
        tier.note_flushed(shared)
        self._flushed.add(manifest.step)

    def _push(self, path: Path, manifest: CheckpointManifest) -> None:
        node, line = self._place.node, self._place.line
        buddy = line.buddy if line is not None else NONE
        if buddy in (NONE, "", node):
            self._pushed.add(manifest.step)
            self._voice.say_once("no-buddy", "this node has no buddy in the tier index: its copies stay on this "
                                             "node (and on shared storage when flushed)")
            return
        try:
            self._link.push(buddy, path, manifest)
        except Exception as exc:  # a gone or refusing buddy: the copy stays local
            if getattr(exc, "retryable", False):  # its server is not up yet, or busy: try again a little later
                self._next_push = time.monotonic() + PUSH_RETRY_SECONDS
            else:
                self._pushed.add(manifest.step)
            self._voice.say_once(f"push:{buddy}", f"cannot send copies to buddy {buddy} ({exc}); they stay on this "
                                                  "node (and on shared storage when flushed) until it answers; "
                                                  "said once")
            return
        self._pushed.add(manifest.step)

    def _received(self, manifest: CheckpointManifest) -> None:
        """The copy server's callback: a buddy copy landed here."""
        tier = self._hold.tier
        if tier is None:
            return
        with self._hold.lock:
            tier.apply_retention(self._place.settings.keep)
            self._hold.rewrite_holdings(force=True)

    def close(self, *, finished: bool) -> None:
        """See Checkpointer.close (local rank 0, the tier usable): the last save's commit waited for, the
        thread stopped, one last round, the flush at the end, the server stopped, and when `finished`
        the tier emptied."""
        tier = self._hold.tier
        assert tier is not None
        self._saver.wait_for_last_commit(self._link.timeout, commit=self._thread is None)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.tend()
        copies = tier.local_copies()
        if self._place.settings.flush_at_end and copies and not self._on_shared(copies[-1][1]):
            self._flush(*copies[-1])
            with self._hold.lock:
                self._hold.rewrite_holdings()
        if self._server is not None:
            self._server.close()
        if finished:
            self._empty_tier()

    def _empty_tier(self) -> None:
        """The run's copies on this node, removed (training is done); the holdings say so."""
        tier = self._hold.tier
        assert tier is not None
        with self._hold.lock:
            tier.remove(tier.copies_on_disk())
            self._hold.rewrite_holdings(force=True)
        kept = len(tier.copies_on_disk())
        self._voice.say(f"training done on {self._place.node}: its checkpoint copies are removed from {tier.root}"
                        + (f" ({kept} could not be)" if kept else ""))
