"""checkpoint_bench.py's new path through the real API: `clusterctl.checkpoint.Checkpointer` for two
nodes on this machine, moving copies with the real CopyServer / push_copy / fetch_copy over loopback.

Per trial (a fresh run key, so fresh tier roots under `--local-dir`): node `bench-a` (slot 0) and
node `bench-b` (slot 1) each have a Checkpointer (one local rank each), with a tier index naming each
the other's buddy; the shared tier is the bench's throttled-rate setting
(`shared_bytes_per_second`, applied by the API's own flush throttle).  `save` is
`bench-a.save_state(step, state)`; the buddy copy is complete when `bench-b`'s
`buddy/bench-a/step-N/` exists (renamed into place after its manifest), the flush when the slot's
folder on shared storage does, both seen from the bench's training loop (a matmul step, ~10 ms).
The resume is a new step: `bench-a` closed, then a new Checkpointer on `bench-a` whose tier index
says "local" (the survivor: resume() verifies its own copy, load_state loads it), and one on
`bench-c`, the replacement in slot 0, whose index says "buddy, held on bench-b" (resume() fetches
the copy from bench-b's server over TCP and verifies it; load_state loads it).

The port in the settings is one for every node of a step; here both nodes share one machine, so
the transport (the API's CopyTransport door) has each node's server listen on 127.0.0.1 on a port
of its own and connects by node name to that port.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clusterctl.checkpoint.api import Checkpointer, CopyService
from clusterctl.checkpoint.copies import ReceivedCopy, shards_of
from clusterctl.checkpoint.tier import shared_copy_dir
from clusterctl.checkpoint.transport import CopyServer, fetch_copy, push_copy
from clusterctl.records.checkpoint_manifest import CheckpointManifest
from clusterctl.records.checkpoint_settings import CheckpointSettings
from clusterctl.records.tier_index import TierSlot, write_tier_index

A, B, C = "bench-a", "bench-b", "bench-c"
LAG_TIMEOUT = 600.0


class LoopbackTransport:
    """The real TCP transport, each node's server on 127.0.0.1 and a port of its own."""

    def __init__(self) -> None:
        self.ports: dict[str, int] = {}

    def push(self, host: str, port: int, key: bytes, copy_dir: Path, manifest: CheckpointManifest, *,
             timeout: float) -> None:
        push_copy("127.0.0.1", self.ports[host], key, copy_dir, manifest, timeout=timeout)

    def fetch(self, host: str, port: int, key: bytes, of_node: str, step: int, dest_dir: Path, *,
              timeout: float) -> ReceivedCopy:
        return fetch_copy("127.0.0.1", self.ports[host], key, of_node, step, dest_dir, timeout=timeout)

    def serve(self, tier_root: Path, node: str, key: bytes, port: int,
              on_received: Callable[[CheckpointManifest], None]) -> CopyService:
        server = CopyServer(tier_root, node, key, 0, host="127.0.0.1", on_received=on_received).start()
        self.ports[node] = server.port
        return server


class ApiTiers:
    """The NewPath of checkpoint_bench.py through Checkpointer (see the module docstring)."""

    name = "api (Checkpointer, TCP copy server over loopback)"

    def __init__(self, local_base: Path, shared_dir: Path, rate: float) -> None:
        self.local_base, self.shared_dir, self.rate = local_base, shared_dir, rate
        self.launch = shared_dir.parent / "launch"
        self.launch.mkdir(exist_ok=True)
        self.key = os.urandom(32)
        self.transport = LoopbackTransport()
        self._open: list[Checkpointer] = []
        self._settings: CheckpointSettings | None = None
        self._a: Checkpointer | None = None
        self._b: Checkpointer | None = None
        self._step = 0
        self._returned = 0.0
        self._replicated: float | None = None
        self._flushed: float | None = None

    def _settings_for(self, index: Path, resume_step: int | None) -> CheckpointSettings:
        assert self._settings is not None
        return CheckpointSettings(run_key=self._settings.run_key, local_base=str(self.local_base),
                                  shared_dir=str(self.shared_dir), tier_index=str(index), port=1, keep=1,
                                  flush_every_steps=0, flush_at_end=False, shared_bytes_per_second=self.rate,
                                  resume_step=resume_step)

    def _checkpointer(self, settings: CheckpointSettings, node: str, slot: int, attempt: str) -> Checkpointer:
        ckpt = Checkpointer(settings, node=node, slot=slot, slots=2, rank=slot, local_rank=0, local_ranks=1,
                            key=self.key, transport=self.transport, attempt=attempt)
        self._open.append(ckpt)
        return ckpt

    def save(self, step: int, state: dict[str, Any]) -> None:
        if self._a is None:  # a new trial: a new run, both nodes started
            index = write_tier_index(self.launch / f"fresh-{step}.idx", None, [TierSlot(A, B), TierSlot(B, A)])
            self._settings = CheckpointSettings(run_key=os.urandom(8).hex(), local_base=str(self.local_base),
                                                shared_dir=str(self.shared_dir), tier_index=str(index), port=1)
            settings = self._settings_for(index, None)
            self._a = self._checkpointer(settings, A, 0, f"save-{step}")
            self._b = self._checkpointer(settings, B, 1, f"save-{step}")
        self._step = step
        self._replicated = self._flushed = None
        self._a.save_state(step, state)
        self._returned = time.perf_counter()

    def background_done(self) -> bool:
        assert self._b is not None and self._b.tier is not None
        now = time.perf_counter()
        if self._replicated is None and self._b.tier.buddy_copy(A, self._step).is_dir():
            self._replicated = now
        if self._flushed is None and shared_copy_dir(self.shared_dir, self._step, 0).is_dir():
            self._flushed = now
        return self._replicated is not None and self._flushed is not None

    def lags(self) -> tuple[float, float]:
        deadline = time.monotonic() + LAG_TIMEOUT
        while not self.background_done():
            if time.monotonic() > deadline:
                raise SystemExit(f"checkpoint_bench: step {self._step}'s copy was not on the buddy and shared "
                                 f"storage {LAG_TIMEOUT:g} s after the save (see the Checkpointer's messages above)")
            time.sleep(0.01)
        assert self._replicated is not None and self._flushed is not None
        return self._replicated - self._returned, self._flushed - self._returned

    def stall_checksums(self, step: int) -> float | None:
        assert self._a is not None and self._a.tier is not None
        began = time.perf_counter()
        shards_of(self._a.tier.local_copy(step))
        return time.perf_counter() - began

    def _resume(self, state: dict[str, Any], step: int, node: str, line: TierSlot) -> float:
        if self._a is not None:
            # The step that saved has ended by a node's loss, not with training done: its tiers are kept
            # (close() with finished=True would empty bench-a's tier, and the survivor would read shared storage).
            self._a.close(finished=False)
        index = write_tier_index(self.launch / f"resume-{node}-{step}.idx", step,
                                 [line, TierSlot(B, A, "shared", B)])
        began = time.perf_counter()
        ckpt = self._checkpointer(self._settings_for(index, step), node, 0, f"resume-{node}-{step}")
        resumed = ckpt.resume()
        if resumed is None or resumed.step != step:
            raise SystemExit(f"checkpoint_bench: {node} resumed {resumed}, not step {step}")
        ckpt.load_state(state)
        took = time.perf_counter() - began
        ckpt.close()
        return took

    def read_survivor(self, state: dict[str, Any], step: int) -> float:
        return self._resume(state, step, A, TierSlot(A, B, "local", A, A))

    def read_replacement(self, state: dict[str, Any], step: int) -> float:
        return self._resume(state, step, C, TierSlot(C, B, "buddy", A, B))

    def clean(self) -> None:
        for ckpt in reversed(self._open):  # the last first: its closing push goes to a buddy still serving
            ckpt.close()
        self._open.clear()
        self._a = self._b = None
        if self._settings is not None:
            shutil.rmtree(self._settings.tier_root(A).parent, ignore_errors=True)
        for child in self.shared_dir.iterdir():
            shutil.rmtree(child, ignore_errors=True)
