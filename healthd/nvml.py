"""healthd's one door to the GPUs: pynvml, every call under a timeout.

A hung driver must not hang the daemon: each NVML call runs on a worker thread and the
caller waits at most `timeout` seconds; a call that does not return is reported as a
hang (itself a finding) and its worker is abandoned (ctypes releases the GIL, so the
rest of the daemon keeps running).  Facts relied on (shared/notes/emulated-nvml.md):
`nvmlEventSetWait` raises NVMLError_Timeout rather than returning None; registering
unsupported event types registers nothing; handles are unhashable ctypes pointers and
on a lost GPU even nvmlDeviceGetIndex fails, so events are mapped by handle address.

Several daemon threads share one `Nvml`: the periodic check discovers GPUs (when NVML comes up
late) and samples them, the event thread registers them and gives up the handles of lost ones,
the main thread and the kernel-log follower read their identities.  So `handles` and
`identities` are snapshots that never change under their reader: `discover` and `forget_handle`
replace them whole, under one lock.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

import pynvml

from clusterctl.healthd.gpu_sample import GpuSample
from clusterctl.healthd.kmsg import normalise_pci
from clusterctl.records.finding_kind import FindingKind


NvmlError = pynvml.NVMLError
"""Any error an NVML call returns: callers catch it by this name, and import no pynvml themselves."""
GpuIsLost = pynvml.NVMLError_GpuIsLost
"""NVML_ERROR_GPU_IS_LOST: every call on that GPU fails from now on."""


class NvmlHang(Exception):
    """An NVML call did not return within the timeout."""

    def __init__(self, function: str, timeout: float) -> None:
        super().__init__(f"{function} did not return within {timeout:g} s")
        self.function = function


class _Worker:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.job: tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]] | None = None
        self.ready = threading.Event()
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        threading.Thread(target=self._loop, name="nvml-call", daemon=True).start()

    def _loop(self) -> None:
        while True:
            self.ready.wait()
            self.ready.clear()
            fn, args, kwargs = self.job  # type: ignore[misc]
            try:
                self.result, self.error = fn(*args, **kwargs), None
            except BaseException as exc:  # handed to the caller
                self.result, self.error = None, exc
            self.done.set()


class NvmlCalls(Protocol):
    """The one door every NVML call goes through: `call(name, fn, *args)` runs `fn(*args)` (a pynvml
    function) and answers for it; `TimedCalls` is the real one, tests/fakes.py's `FakeNvmlDriver`
    answers NVML's part itself."""

    def __call__(self, name: str, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any: ...


class TimedCalls:
    """Runs callables on a worker thread with a timeout; a hung worker is replaced."""

    def __init__(self, timeout: float, observe: Callable[[str, float, bool], None] | None = None,
                 max_abandoned: int = 8) -> None:
        self.timeout, self.observe, self.max_abandoned = timeout, observe, max_abandoned
        self.abandoned = 0
        self._worker = _Worker()
        self._lock = threading.Lock()

    def __call__(self, name: str, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
        limit = self.timeout if timeout is None else timeout
        with self._lock:
            if self.abandoned >= self.max_abandoned:
                raise NvmlHang(name, limit)
            worker = self._worker
            worker.done.clear()
            worker.job = (fn, args, {})
            started = time.monotonic()
            worker.ready.set()
            finished = worker.done.wait(limit)
            elapsed = time.monotonic() - started
            if not finished:
                self.abandoned += 1
                self._worker = _Worker()  # the old one stays blocked in the driver
        if self.observe:
            self.observe(name, elapsed, finished)
        if not finished:
            raise NvmlHang(name, limit)
        if worker.error is not None:
            raise worker.error
        return worker.result


@dataclass(frozen=True)
class GpuIdentity:
    index: int
    uuid: str
    pci_bus: str  # normalised "0000:5d:00"


def handle_address(handle: Any) -> int:
    """A stable key for a device handle (handles themselves are neither == nor hashable)."""
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


class NvmlReader(Protocol):
    """What reading this node's GPUs once asks of NVML (`healthd evidence`, the periodic scan): `Nvml`
    is the real one, tests/fakes.py's `FakeNvml` answers from a table."""

    def init(self) -> None: ...

    def count(self) -> int: ...

    def discover(self) -> list[GpuIdentity]: ...

    def sample(self, index: int) -> GpuSample: ...

    def shutdown(self) -> None: ...


class NvmlDoor(NvmlReader, Protocol):
    """What healthd's daemon and its event watcher ask of NVML besides reading: the snapshots of handles
    and identities, giving up a lost GPU's handle, and the call door (`Nvml` is the real one)."""

    @property
    def call(self) -> NvmlCalls: ...

    @property
    def handles(self) -> Mapping[int, Any]: ...

    @property
    def identities(self) -> Mapping[int, GpuIdentity]: ...

    def forget_handle(self, index: int) -> None: ...


class Nvml:
    """The NVML calls healthd makes, each through `TimedCalls`; safe to share between threads."""

    def __init__(self, calls: NvmlCalls) -> None:
        self.call = calls
        self._lock = threading.Lock()
        self._handles: Mapping[int, Any] = MappingProxyType({})
        self._identities: Mapping[int, GpuIdentity] = MappingProxyType({})
        self.initialised = False
        """nvmlInit succeeded (before it, an NVMLError means NVML cannot be used at all)."""

    @property
    def handles(self) -> Mapping[int, Any]:
        """Device handles by GPU index, as of now: a read-only snapshot that a later change replaces
        instead of changing (iterate it while NVML calls run, another thread cannot disturb it)."""
        return self._handles

    @property
    def identities(self) -> Mapping[int, GpuIdentity]:
        """Identities by GPU index, as of now: a read-only snapshot, like `handles`.  A GPU whose handle
        was given up (`forget_handle`) keeps its identity, so what is said about it names its UUID."""
        return self._identities

    def init(self) -> None:
        self.call("nvmlInit", pynvml.nvmlInit)
        self.initialised = True

    def shutdown(self) -> None:
        try:
            self.call("nvmlShutdown", pynvml.nvmlShutdown, timeout=2)
        except (pynvml.NVMLError, NvmlHang):
            pass

    def count(self) -> int:
        return int(self.call("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount))

    def discover(self) -> list[GpuIdentity]:
        """Handles and identities of every GPU; lost ones are skipped here (samples report them lost).

        Each GPU is published as soon as it is identified, so a discovery that fails part-way keeps
        the GPUs identified before the failure.
        """
        for index in range(self.count()):
            try:
                handle = self.call("nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex, index)
                uuid = self.call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, handle)
                pci = self.call("nvmlDeviceGetPciInfo", pynvml.nvmlDeviceGetPciInfo, handle).busId
            except pynvml.NVMLError_GpuIsLost:
                continue
            identity = GpuIdentity(index, uuid, normalise_pci(pci))
            with self._lock:
                self._handles = MappingProxyType({**self._handles, index: handle})
                self._identities = MappingProxyType({**self._identities, index: identity})
        identities = self._identities
        return [identities[i] for i in sorted(identities)]

    def forget_handle(self, index: int) -> None:
        """Give up GPU `index`'s handle (the GPU is lost: every call on it fails); its identity stays."""
        with self._lock:
            self._handles = MappingProxyType({i: h for i, h in self._handles.items() if i != index})

    def sample(self, index: int) -> GpuSample:
        """Read every health counter of one GPU (a lost GPU gives `lost=True`)."""
        identity = self.identities.get(index)
        uuid = identity.uuid if identity else ""
        try:
            handle = self.handles.get(index)
            if handle is None:
                handle = self.call("nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex, index)
            c = self.call
            dbe = c("nvmlDeviceGetTotalEccErrors", pynvml.nvmlDeviceGetTotalEccErrors, handle,
                    pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
            sbe = c("nvmlDeviceGetTotalEccErrors", pynvml.nvmlDeviceGetTotalEccErrors, handle,
                    pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC)
            corr, unc, pending, failure = c("nvmlDeviceGetRemappedRows", pynvml.nvmlDeviceGetRemappedRows, handle)
            retired_sbe = len(c("nvmlDeviceGetRetiredPages", pynvml.nvmlDeviceGetRetiredPages, handle,
                                pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS))
            retired_dbe = len(c("nvmlDeviceGetRetiredPages", pynvml.nvmlDeviceGetRetiredPages, handle,
                                pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR))
            retired_pending = c("nvmlDeviceGetRetiredPagesPendingStatus",
                                pynvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
            temperature = c("nvmlDeviceGetTemperature", pynvml.nvmlDeviceGetTemperature, handle,
                            pynvml.NVML_TEMPERATURE_GPU)
            clocks = self._optional("nvmlDeviceGetCurrentClocksEventReasons",
                                    pynvml.nvmlDeviceGetCurrentClocksEventReasons, handle, default=0)
            sm_clock = self._optional("nvmlDeviceGetClockInfo", pynvml.nvmlDeviceGetClockInfo, handle,
                                      pynvml.NVML_CLOCK_SM, default=None)
            sm_clock_max = self._optional("nvmlDeviceGetMaxClockInfo", pynvml.nvmlDeviceGetMaxClockInfo, handle,
                                          pynvml.NVML_CLOCK_SM, default=None)
            links = range(self._link_count(handle))
            down = tuple(link for link in links
                         if c("nvmlDeviceGetNvLinkState", pynvml.nvmlDeviceGetNvLinkState, handle, link) == 0)
            recovery = self._recovery_action(handle)
            width, width_max, gen, gen_max = c("nvmlDeviceGetCurrPcieLinkWidth", _pcie_link, handle)
            errors = c("nvmlDeviceGetNvLinkErrorCounter", _nvlink_errors, handle,
                       tuple(link for link in links if link not in down))
        except pynvml.NVMLError_GpuIsLost:
            return GpuSample(index, uuid, lost=True)
        return GpuSample(index, uuid, False, dbe, sbe, corr, unc, bool(pending), bool(failure), retired_sbe,
                         retired_dbe, bool(retired_pending), temperature, clocks, down, recovery,
                         None if sm_clock is None else int(sm_clock), None if sm_clock_max is None else int(sm_clock_max),
                         pcie_width=width, pcie_width_max=width_max, pcie_gen=gen, pcie_gen_max=gen_max,
                         nvlink_errors=errors)

    def _optional(self, name: str, fn: Callable[..., Any], *args: Any, default: Any) -> Any:
        try:
            return self.call(name, fn, *args)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
            return default

    def _link_count(self, handle: Any) -> int:
        values = self._optional("nvmlDeviceGetFieldValues", pynvml.nvmlDeviceGetFieldValues, handle,
                                [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT], default=None)
        if not values or values[0].nvmlReturn != 0:
            return 0
        return int(values[0].value.uiVal)

    def _recovery_action(self, handle: Any) -> int | None:
        field_id = getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 230)
        values = self._optional("nvmlDeviceGetFieldValues", pynvml.nvmlDeviceGetFieldValues, handle, [field_id],
                                default=None)
        if not values or values[0].nvmlReturn != 0:
            return None
        return int(values[0].value.uiVal)


_NOT_THERE = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound)
_NVLINK_COUNTERS = (pynvml.NVML_NVLINK_ERROR_DL_REPLAY, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
                    pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT)


def _pcie_link(handle: Any) -> tuple[int | None, int | None, int | None, int | None]:
    """Current and maximum PCIe link width and generation (None where the GPU does not say): four calls
    made as one through the call door, so a GPU costs one worker hand-off for them, not four."""
    values: list[int | None] = []
    for fn in (pynvml.nvmlDeviceGetCurrPcieLinkWidth, pynvml.nvmlDeviceGetMaxPcieLinkWidth,
               pynvml.nvmlDeviceGetCurrPcieLinkGeneration, pynvml.nvmlDeviceGetMaxPcieLinkGeneration):
        try:
            values.append(int(fn(handle)))
        except _NOT_THERE:
            values.append(None)
    width, width_max, gen, gen_max = values
    return width, width_max, gen, gen_max


def _nvlink_errors(handle: Any, links: tuple[int, ...]) -> tuple[tuple[int, int, int, int], ...]:
    """(link, replay, recovery, CRC flit) error counters of each of `links`, in one call through the door
    (18 links x 3 counters would be 54 worker hand-offs a GPU); none where the GPU does not count them."""
    out = []
    for link in links:
        try:
            replay, recovery, crc = (int(pynvml.nvmlDeviceGetNvLinkErrorCounter(handle, link, counter))
                                     for counter in _NVLINK_COUNTERS)
        except _NOT_THERE:
            return ()
        out.append((link, replay, recovery, crc))
    return tuple(out)


WANTED_EVENTS = (pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
                 | getattr(pynvml, "nvmlEventTypeGpuUnavailableError", 0)
                 | getattr(pynvml, "nvmlEventTypeGpuRecoveryAction", 0))


EVENT_KINDS: dict[int, FindingKind] = {
    pynvml.nvmlEventTypeXidCriticalError: "xid",
    pynvml.nvmlEventTypeDoubleBitEccError: "ecc-dbe",
    getattr(pynvml, "nvmlEventTypeGpuUnavailableError", -1): "gpu-lost",
    getattr(pynvml, "nvmlEventTypeGpuRecoveryAction", -2): "recovery-action",
}
"""The finding kind of each NVML event type healthd watches (any other is "nvml-error")."""


@dataclass(frozen=True)
class GpuEvent:
    """An NVML event mapped back to its GPU."""

    gpu: int
    event_type: int
    data: int

    @property
    def kind(self) -> FindingKind:
        """What this event is a finding of."""
        return EVENT_KINDS.get(self.event_type, "nvml-error")


class EventWatcher:
    """An NVML event set over every healthy GPU, rebuilt when a GPU is lost."""

    def __init__(self, nvml: NvmlDoor) -> None:
        self.nvml = nvml
        self.event_set: Any = None
        self.by_address: dict[int, int] = {}

    def build(self) -> list[int]:
        """Register the wanted event types each GPU supports; return the GPUs watched."""
        if self.event_set is not None:
            try:
                self.nvml.call("nvmlEventSetFree", pynvml.nvmlEventSetFree, self.event_set, timeout=2)
            except (pynvml.NVMLError, NvmlHang):
                pass
        self.event_set = self.nvml.call("nvmlEventSetCreate", pynvml.nvmlEventSetCreate)
        self.by_address = {}
        for index, handle in self.nvml.handles.items():
            try:
                supported = self.nvml.call("nvmlDeviceGetSupportedEventTypes",
                                           pynvml.nvmlDeviceGetSupportedEventTypes, handle)
                self.nvml.call("nvmlDeviceRegisterEvents", pynvml.nvmlDeviceRegisterEvents, handle,
                               supported & WANTED_EVENTS, self.event_set)
            except pynvml.NVMLError_GpuIsLost:
                continue
            except pynvml.NVMLError_NotSupported:
                continue
            self.by_address[handle_address(handle)] = index
        return sorted(self.by_address.values())

    def wait(self, timeout_ms: int) -> GpuEvent | None:
        """The next event, or None on timeout.  Raises NVMLError_GpuIsLost (then rebuild)."""
        try:
            # The wait blocks in the driver with the GIL released; no extra timeout thread needed.
            data = pynvml.nvmlEventSetWait(self.event_set, timeout_ms)
        except pynvml.NVMLError_Timeout:
            return None
        gpu = self.by_address.get(handle_address(data.device), -1)
        return GpuEvent(gpu, int(data.eventType), int(data.eventData))


def lost_gpus(nvml: NvmlDoor) -> list[int]:
    """The GPUs whose handle now answers NVML_ERROR_GPU_IS_LOST; their handles are given up (identities kept).

    A GPU that answers any other error (or hangs) is not called lost here.
    """
    lost = []
    for index, handle in nvml.handles.items():  # a snapshot: forgetting a handle does not change it
        try:
            nvml.call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, handle)
        except pynvml.NVMLError_GpuIsLost:
            lost.append(index)
            nvml.forget_handle(index)
        except (pynvml.NVMLError, NvmlHang):
            pass
    return lost
