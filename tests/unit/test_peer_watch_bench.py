"""The neighbours' watch benchmark's own logic, without a network: its replay of one watcher's beats around
each run of losses names the silences the real PeerWatch names when told every beat (bench/peer_watch_bench.py
measures; no timing here)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import peer_watch_bench as bench  # noqa: E402


@pytest.mark.parametrize("loss", [0.0, 0.05, 0.3, 0.6])
def test_the_replay_around_losses_names_what_the_whole_replay_names(loss: float) -> None:
    lost = np.random.default_rng(7).random(2000) < loss
    assert bench.suspicions_in(lost, bench.PeerWatch(("p",)), "p") == bench.full_replay(lost, "p")


def test_no_beat_lost_is_no_suspicion_and_every_long_run_of_losses_is_one() -> None:
    lost = np.zeros(1000, dtype=bool)
    assert bench.loss_trial(20, 0.1, 0.0, seed=1, check=True)["suspicions"] == 0
    lost[100:110] = True  # 5 s of lost beats: one silence
    lost[300:303] = True  # 1.5 s: none
    assert bench.suspicions_in(lost, bench.PeerWatch(("p",)), "p") == 1
