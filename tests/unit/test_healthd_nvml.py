"""healthd's NVML door shared by the daemon's threads: what one thread reads is never changed under it
by another (the periodic check discovering GPUs, the event thread giving up a lost GPU's handle).

The fake (tests/fakes.py's `FakeNvmlDriver`) answers below the `Nvml` class, at its one call door
(`NvmlCalls`), and runs a test's hook just before a named call: that is where another thread could
run while this one waits on the driver, so a test interleaves the two threads' work deterministically."""

from __future__ import annotations

from clusterctl.healthd.nvml import EventWatcher, Nvml
from tests.fakes import FakeNvmlDriver


def test_registering_events_is_not_disturbed_by_a_gpu_the_periodic_check_finds_meanwhile():
    driver = FakeNvmlDriver(2)
    nvml = Nvml(driver)
    nvml.discover()
    watcher = EventWatcher(nvml)

    def periodic_thread_discovers() -> None:  # NVML now counts a third GPU
        driver.count = 3
        nvml.discover()

    driver.before["nvmlDeviceRegisterEvents"] = periodic_thread_discovers  # while GPU 0 is being registered
    assert watcher.build() == [0, 1]  # the GPUs there when it began
    assert watcher.build() == [0, 1, 2]  # the next build watches the new one too


def test_the_gpus_a_reader_holds_never_change_under_it():
    driver = FakeNvmlDriver(2)
    nvml = Nvml(driver)
    nvml.discover()
    handles, identities = nvml.handles, nvml.identities  # e.g. the main thread writing the state file
    driver.count = 3
    nvml.discover()
    nvml.forget_handle(0)
    assert sorted(handles) == [0, 1] and sorted(identities) == [0, 1]
    assert sorted(nvml.handles) == [1, 2] and sorted(nvml.identities) == [0, 1, 2]


def test_a_lost_gpus_handle_is_given_up_and_its_identity_kept_for_what_is_said_about_it():
    driver = FakeNvmlDriver(3)
    nvml = Nvml(driver)
    nvml.discover()
    watcher = EventWatcher(nvml)
    driver.lost.add(1)
    nvml.forget_handle(1)
    assert watcher.build() == [0, 2]
    assert nvml.identities[1].uuid == "GPU-1" and nvml.identities[1].pci_bus == "0000:11:00"
    assert nvml.sample(1).lost  # asked again by index, NVML says it is lost
