"""healthd's NVML door shared by the daemon's threads: what one thread reads is never changed under it
by another (the periodic check discovering GPUs, the event thread giving up a lost GPU's handle).

The fake answers below the `Nvml` class, at its one call door, and runs a test's hook just before
a named call: that is where another thread could run while this one waits on the driver, so a
test interleaves the two threads' work deterministically."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pynvml

from clusterctl.healthd.nvml import EventWatcher, Nvml, handle_address

BASE = 0x1000


class FakeDriver:
    """NVML's answers for `count` GPUs (GPU i at PCI 0000:1i:00); `before[name]` runs once, just before that call."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.lost: set[int] = set()
        self.before: dict[str, Callable[[], None]] = {}

    def __call__(self, name: str, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
        hook = self.before.pop(name, None)
        if hook is not None:
            hook()
        if name == "nvmlDeviceGetCount":
            return self.count
        if name == "nvmlDeviceGetHandleByIndex":
            return ctypes.c_void_p(BASE + args[0])
        if name in ("nvmlEventSetCreate", "nvmlEventSetFree"):
            return object()
        index = handle_address(args[0]) - BASE
        if index in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        answers = {"nvmlDeviceGetUUID": f"GPU-{index}", "nvmlDeviceGetPciInfo": SimpleNamespace(busId=f"0000:1{index}:00.0"),
                   "nvmlDeviceGetSupportedEventTypes": pynvml.nvmlEventTypeXidCriticalError,
                   "nvmlDeviceRegisterEvents": None}
        return answers[name]


def test_registering_events_is_not_disturbed_by_a_gpu_the_periodic_check_finds_meanwhile():
    driver = FakeDriver(2)
    nvml = Nvml(driver)  # type: ignore[arg-type]
    nvml.discover()
    watcher = EventWatcher(nvml)

    def periodic_thread_discovers() -> None:  # NVML now counts a third GPU
        driver.count = 3
        nvml.discover()

    driver.before["nvmlDeviceRegisterEvents"] = periodic_thread_discovers  # while GPU 0 is being registered
    assert watcher.build() == [0, 1]  # the GPUs there when it began
    assert watcher.build() == [0, 1, 2]  # the next build watches the new one too


def test_the_gpus_a_reader_holds_never_change_under_it():
    driver = FakeDriver(2)
    nvml = Nvml(driver)  # type: ignore[arg-type]
    nvml.discover()
    handles, identities = nvml.handles, nvml.identities  # e.g. the main thread writing the state file
    driver.count = 3
    nvml.discover()
    nvml.forget_handle(0)
    assert sorted(handles) == [0, 1] and sorted(identities) == [0, 1]
    assert sorted(nvml.handles) == [1, 2] and sorted(nvml.identities) == [0, 1, 2]


def test_a_lost_gpus_handle_is_given_up_and_its_identity_kept_for_what_is_said_about_it():
    driver = FakeDriver(3)
    nvml = Nvml(driver)  # type: ignore[arg-type]
    nvml.discover()
    watcher = EventWatcher(nvml)
    driver.lost.add(1)
    nvml.forget_handle(1)
    assert watcher.build() == [0, 2]
    assert nvml.identities[1].uuid == "GPU-1" and nvml.identities[1].pci_bus == "0000:11:00"
    assert nvml.sample(1).lost  # asked again by index, NVML says it is lost
