"""The emulated libnvidia-ml.so.1, driven through the real, unmodified pynvml.

Each check runs in a fresh interpreter: pynvml loads libnvidia-ml.so.1 by soname
once per process, and LD_LIBRARY_PATH is read only at process start.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("clusterctl_testbed", reason="tests the testbed package: pip install -e ./testbed")

from clusterctl_testbed.cluster import build_nvml  # noqa: E402
from clusterctl_testbed.gpu_faults import Fault, inject  # noqa: E402


@pytest.fixture(scope="module")
def nvml_lib(tmp_path_factory) -> Path:
    lib = tmp_path_factory.mktemp("nvml") / "libnvidia-ml.so.1"
    build_nvml(lib)
    return lib


@pytest.fixture()
def node(tmp_path) -> Path:
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    (node_dir / "events").touch()
    return node_dir


def pynvml(lib: Path, node_dir: Path | None, code: str, timeout: float = 30) -> subprocess.CompletedProcess:
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib.parent)}
    env.pop("NVML_EMU_ROOT", None)
    if node_dir is not None:
        env["NVML_EMU_DIR"] = str(node_dir)
    else:
        env.pop("NVML_EMU_DIR", None)
    prelude = "import pynvml as n\n"
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=timeout)


def test_builds_against_nvidias_real_header(tmp_path):
    import nvidia  # the nvidia-nvml-dev wheel (test extra) ships nvml.h

    headers = sorted(p for base in nvidia.__path__ for p in Path(base).glob("*/include/nvml.h"))
    assert headers, "nvidia-nvml-dev is part of the test extras; `pip install -e .[test]`"
    build_nvml(tmp_path / "libnvidia-ml.so.1", header_dir=headers[-1].parent)


def test_eight_healthy_gpus_by_default(nvml_lib, node):
    out = pynvml(nvml_lib, node, """
        n.nvmlInit()
        handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
        uuids = {n.nvmlDeviceGetUUID(h) for h in handles}
        buses = [n.nvmlDeviceGetPciInfo(h).busId for h in handles]
        h = handles[0]
        print(len(handles), len(uuids), buses[3])
        print(n.nvmlDeviceGetRemappedRows(h), n.nvmlDeviceGetRetiredPages(h, 1),
              n.nvmlDeviceGetRetiredPagesPendingStatus(h), n.nvmlDeviceGetTotalEccErrors(h, 1, 0),
              n.nvmlDeviceGetEccMode(h), n.nvmlDeviceGetNvLinkState(h, 17))
        same = n.nvmlDeviceGetHandleByUUID(n.nvmlDeviceGetUUID(handles[5]))
        print(n.nvmlDeviceGetIndex(same), n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByPciBusId("0000:5D:00.0")))
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["8 8 00000000:5D:00.0", "(0, 0, 0, 0) [] 0 0 [1, 1] 1", "5 3"]


def test_no_node_directory_means_no_driver(nvml_lib, tmp_path):
    out = pynvml(nvml_lib, tmp_path / "absent", """
        try: n.nvmlInit()
        except n.NVMLError_DriverNotLoaded: print("driver not loaded")
    """)
    assert out.stdout.strip() == "driver not loaded", out.stderr


def test_memory_faults_read_back(nvml_lib, node):
    for fault in (Fault("ecc-dbe", gpu=1), Fault("remap-pending", gpu=1), Fault("remap-failure", gpu=2),
                  Fault("retired-pages", gpu=2, value=3), Fault("recovery-action", gpu=2, value=2),
                  Fault("temp", gpu=4, value=91), Fault("nvlink-down", gpu=4, value=7)):
        inject(node, fault)
    out = pynvml(nvml_lib, node, """
        n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex
        print(n.nvmlDeviceGetTotalEccErrors(h(1), n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC))
        print(n.nvmlDeviceGetRemappedRows(h(1)), n.nvmlDeviceGetRemappedRows(h(2)))
        print(len(n.nvmlDeviceGetRetiredPages(h(2), n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)),
              n.nvmlDeviceGetRetiredPagesPendingStatus(h(2)))
        fv = n.nvmlDeviceGetFieldValues(h(2), [n.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])[0]
        print(fv.nvmlReturn, fv.value.uiVal)
        print(n.nvmlDeviceGetTemperature(h(4), n.NVML_TEMPERATURE_GPU), n.nvmlDeviceGetNvLinkState(h(4), 7))
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["1", "(0, 1, 1, 0) (0, 0, 0, 1)", "3 1", "0 2", "91 0"]


def test_event_semantics_unsupported_timeout_and_lost(nvml_lib, node):
    env = {**os.environ, "LD_LIBRARY_PATH": str(nvml_lib.parent), "NVML_EMU_DIR": str(node)}
    code = textwrap.dedent("""
        import pynvml as n, sys
        n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(2); es = n.nvmlEventSetCreate()
        try: n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeAll, es)
        except n.NVMLError_NotSupported: print("all: not supported")
        n.nvmlDeviceRegisterEvents(h, n.nvmlDeviceGetSupportedEventTypes(h), es)
        try: n.nvmlEventSetWait(es, 20)
        except n.NVMLError_Timeout: print("timeout raises")
        print("ready", flush=True)
        d = n.nvmlEventSetWait(es, 5000)
        print(d.eventType == n.nvmlEventTypeDoubleBitEccError)
        d = n.nvmlEventSetWait(es, 5000)
        print(d.eventType == n.nvmlEventTypeXidCriticalError, d.eventData)
        for _ in range(2):
            try: n.nvmlEventSetWait(es, 5000)
            except n.NVMLError_GpuIsLost: print("wait: lost")
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    lines = [proc.stdout.readline().strip() for _ in range(3)]
    assert lines == ["all: not supported", "timeout raises", "ready"], proc.stderr.read()
    inject(node, Fault("xid", gpu=1, value=31))  # another GPU: not delivered to this set
    inject(node, Fault("ecc-dbe", gpu=2))
    inject(node, Fault("xid", gpu=2, value=79))
    rest, err = proc.communicate(timeout=30)
    assert rest.splitlines() == ["True", "True 79", "wait: lost", "wait: lost"], err


def test_lost_gpu_fails_every_call_and_missing_gpu_shrinks_the_count(nvml_lib, node):
    inject(node, Fault("gpu-lost", gpu=6))
    inject(node, Fault("gpu-missing", value=7))
    out = pynvml(nvml_lib, node, """
        n.nvmlInit()
        print(n.nvmlDeviceGetCount())
        try: n.nvmlDeviceGetHandleByIndex(6)
        except n.NVMLError_GpuIsLost as e: print("lost:", e)
        try: n.nvmlDeviceGetHandleByIndex(7)
        except n.NVMLError_InvalidArgument: print("index 7: invalid argument")
    """)
    assert out.stdout.splitlines() == ["7", "lost: GPU is lost", "index 7: invalid argument"], out.stderr


def test_injected_hang_blocks_only_that_function_until_its_deadline(nvml_lib, node):
    code = """
        import sys, time
        n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0)
        print("ready", flush=True); sys.stdin.readline()
        t = time.monotonic(); n.nvmlDeviceGetUUID(h); fast = time.monotonic() - t
        t = time.monotonic(); n.nvmlDeviceGetTemperature(h, 0); slow = time.monotonic() - t
        print(fast < 0.3, slow >= 0.3)
    """
    env = {**os.environ, "LD_LIBRARY_PATH": str(nvml_lib.parent), "NVML_EMU_DIR": str(node)}
    proc = subprocess.Popen([sys.executable, "-c", "import pynvml as n\n" + textwrap.dedent(code)], text=True, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().strip() == "ready"  # started, however long that took on a loaded machine
    inject(node, Fault("nvml-hang", function="nvmlDeviceGetTemperature", seconds=0.6))
    out, err = proc.communicate("go\n", timeout=30)
    assert out.strip() == "True True", err


def test_clearing_a_hang_releases_a_blocked_call(nvml_lib, node):
    inject(node, Fault("nvml-hang", function="nvmlDeviceGetCount", seconds=600))
    env = {**os.environ, "LD_LIBRARY_PATH": str(nvml_lib.parent), "NVML_EMU_DIR": str(node)}
    proc = subprocess.Popen([sys.executable, "-c", "import pynvml as n; n.nvmlInit(); print('init', flush=True); "
                             "print(n.nvmlDeviceGetCount())"], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "init"
    time.sleep(0.2)
    assert proc.poll() is None, "the call should be blocked by the injected hang"
    inject(node, Fault("clear"))
    assert proc.communicate(timeout=10)[0].strip() == "8"


def test_a_throttled_gpu_reports_a_lower_sm_clock_and_thermal_reasons_until_the_throttle_ends(nvml_lib, node):
    code = """
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(2)
        print(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM), n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM),
              n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_GRAPHICS), n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM),
              n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_VIDEO), hex(n.nvmlDeviceGetCurrentClocksEventReasons(h)))
    """
    assert pynvml(nvml_lib, node, code).stdout.split() == ["1980", "1980", "1980", "2619", "1755", "0x0"]
    inject(node, Fault("throttle", gpu=2, value=40))
    assert pynvml(nvml_lib, node, code).stdout.split() == ["792", "1980", "792", "2619", "1755", "0x60"]
    inject(node, Fault("throttle", gpu=2, value=100))
    assert pynvml(nvml_lib, node, code).stdout.split() == ["1980", "1980", "1980", "2619", "1755", "0x0"]


def test_a_gpu_lost_while_throttled_fails_its_clock_queries_like_every_other_call(nvml_lib, node):
    inject(node, Fault("throttle", gpu=6, value=40))
    env = {**os.environ, "LD_LIBRARY_PATH": str(nvml_lib.parent), "NVML_EMU_DIR": str(node)}
    code = textwrap.dedent("""
        import pynvml as n, sys
        n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(6)
        print(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM), flush=True)
        sys.stdin.readline()
        for query in (n.nvmlDeviceGetClockInfo, n.nvmlDeviceGetMaxClockInfo):
            try: print(query(h, n.NVML_CLOCK_SM))
            except n.NVMLError_GpuIsLost as e: print("lost:", e)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "792"
    inject(node, Fault("gpu-lost", gpu=6))
    out, err = proc.communicate("go\n", timeout=30)
    assert out.splitlines() == ["lost: GPU is lost", "lost: GPU is lost"], err


def test_a_hung_clock_query_blocks_its_caller_until_the_hang_is_cleared(nvml_lib, node):
    inject(node, Fault("nvml-hang", function="nvmlDeviceGetClockInfo", seconds=600))
    env = {**os.environ, "LD_LIBRARY_PATH": str(nvml_lib.parent), "NVML_EMU_DIR": str(node)}
    code = ("import pynvml as n; n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0); "
            "print(n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM), flush=True); "
            "print(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM))")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "1980"  # only the hung function blocks
    time.sleep(0.2)
    assert proc.poll() is None, "the clock query should be blocked by the injected hang"
    inject(node, Fault("clear"))
    assert proc.communicate(timeout=10)[0].strip() == "1980"


def test_healthd_evidence_names_the_throttled_gpu_as_a_user_would_read_it(nvml_lib, node, tmp_path):
    import json

    from clusterctl.records.gpu_evidence import GpuEvidence

    inject(node, Fault("throttle", gpu=5, value=40))
    config = tmp_path / "healthd.toml"
    config.write_text(f'node = "node7"\nstate_dir = "{tmp_path / "state"}"\n')
    env = {**os.environ, "LD_LIBRARY_PATH": str(nvml_lib.parent), "NVML_EMU_DIR": str(node)}
    argv = [sys.executable, "-m", "clusterctl.healthd", "evidence", "--config", str(config)]
    out = subprocess.run([*argv, "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    evidence = GpuEvidence.from_json(json.loads(out.stdout), "healthd evidence")
    assert evidence.node == "node7" and len(evidence.gpus) == 8
    assert evidence.slowdown_reasons() == ("GPU 5: clock event reasons SW thermal slowdown, HW thermal slowdown "
                                           "(0x60); SM clock 792/1980 MHz (40%); 38 °C",)
    assert evidence.problems == (f"no healthd state in {tmp_path / 'state'} (is healthd running on this node?)",)
    text = subprocess.run([*argv, "--gpus", "5"], capture_output=True, text=True, env=env, timeout=60).stdout
    assert "GPU 5 " in text and "GPU 4 " not in text and "slowed: GPU 5: clock event reasons" in text
    bad = subprocess.run([*argv, "--gpus", "five"], capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 2 and "'five' is not a GPU index (expected indexes separated by commas" in bad.stderr


def test_a_jobs_evidence_reads_only_the_gpus_slurm_gave_its_step_and_a_throttled_neighbour_explains_nothing(
        nvml_lib, node, tmp_path):
    import json

    from clusterctl.records.gpu_evidence import GpuEvidence

    inject(node, Fault("throttle", gpu=5, value=40))  # another job's GPU on the shared node
    config = tmp_path / "healthd.toml"
    config.write_text(f'node = "node7"\nstate_dir = "{tmp_path / "state"}"\n')
    env = {**os.environ, "LD_LIBRARY_PATH": str(nvml_lib.parent), "NVML_EMU_DIR": str(node),
           "SLURM_STEP_GPUS": "0,1,2,3", "SLURM_JOB_GPUS": "4,5,6,7"}
    argv = [sys.executable, "-m", "clusterctl.healthd", "evidence", "--config", str(config), "--job-gpus"]
    out = subprocess.run([*argv, "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    evidence = GpuEvidence.from_json(json.loads(out.stdout), "healthd evidence")
    assert [g.index for g in evidence.gpus] == [0, 1, 2, 3] and evidence.slowdown_reasons() == ()
    assert evidence.scope == "GPU 0,1,2,3: this job's on this node (SLURM_STEP_GPUS)"
    text = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60).stdout
    assert "GPU 5" not in text and "slowed: nothing here explains a slowdown" in text, text
    bad = subprocess.run(argv, capture_output=True, text=True, env={**env, "SLURM_STEP_GPUS": "0-3"}, timeout=60)
    assert bad.returncode == 0 and "Traceback" not in bad.stderr
    assert bad.stdout.splitlines()[0] == "node7: 0 GPUs read (no GPU: SLURM_STEP_GPUS is not a GPU list)"
    assert bad.stdout.splitlines()[-1] == ("problem: SLURM_STEP_GPUS='0-3' is not a GPU list: '0-3' is not a GPU index "
                                           "(expected indexes separated by commas, e.g. 0,1,3); no GPU was read")


def test_healthd_evidence_joins_healthds_warning_on_a_hot_gpu_and_reports_a_lost_one(nvml_lib, node, tmp_path):
    import json

    from clusterctl.records.actions import Action
    from clusterctl.records.gpu_evidence import GpuEvidence
    from clusterctl.records.healthd_state import GpuState, HealthdState, StateFinding, write_healthd_state

    inject(node, Fault("temp", gpu=6, value=94))
    inject(node, Fault("remap-pending", gpu=6))
    inject(node, Fault("gpu-lost", gpu=1))
    hot = StateFinding("thermal", Action.WARN, "temperature high", "periodic", time.time() - 20, gpu=6, current=True)
    write_healthd_state(tmp_path / "state", HealthdState("node7", 1, "v", time.time(), "2026-11-23T00:00:00Z", True,
                                                         gpus=(GpuState(6, "GPU-6", "0000:ba:00", (hot,)),)))
    config = tmp_path / "healthd.toml"
    config.write_text(f'node = "node7"\nstate_dir = "{tmp_path / "state"}"\n')
    env = {**os.environ, "LD_LIBRARY_PATH": str(nvml_lib.parent), "NVML_EMU_DIR": str(node)}
    argv = [sys.executable, "-m", "clusterctl.healthd", "evidence", "--config", str(config),
            "--json"]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    evidence = GpuEvidence.from_json(json.loads(out.stdout), "healthd evidence")
    assert [g.index for g in evidence.gpus] == list(range(8)) and evidence.problems == ()
    assert evidence.gpus[1].findings == ("gpu-lost: NVML says the GPU is lost",)
    assert evidence.gpus[6].temperature_c == 94 and evidence.gpus[6].remapped_pending
    assert evidence.slowdown_reasons() == ("GPU 6: healthd: thermal: temperature high (warn); 94 °C",)
    assert evidence.slowdown_reasons(gpus=[0, 1]) == ()
    some = subprocess.run([*argv, "--gpus", "6,9"], capture_output=True, text=True, env=env, timeout=60)
    assert [g.index for g in GpuEvidence.from_json(json.loads(some.stdout), "healthd evidence").gpus] == [6]
    assert "GPU 9: not on this node (NVML counts 8 GPUs)" in some.stdout
    no_driver = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                               env={**env, "NVML_EMU_DIR": str(tmp_path / "no-such-node")})
    assert no_driver.returncode == 4 and no_driver.stdout == ""
    assert no_driver.stderr.startswith("healthd: error: cannot read the GPUs through NVML: ")
    assert len(no_driver.stderr.splitlines()) == 1 and "Traceback" not in no_driver.stderr


def test_healthd_reads_an_injected_pcie_downtrain_and_nvlink_error_burst_through_the_emulated_driver(nvml_lib, node):
    inject(node, Fault("pcie-degraded", gpu=2, value=8))
    out = pynvml(nvml_lib, node, f"""
        import subprocess
        from clusterctl.healthd.checks import CheckLimits, Sustained, check_gpu
        from clusterctl.healthd.nvml import Nvml, TimedCalls
        nvml = Nvml(TimedCalls(5.0))
        nvml.init()
        nvml.discover()
        sustained, limits = Sustained(), CheckLimits()
        def findings(now):
            return [(f.kind, f.detail) for i in range(nvml.count()) for f in check_gpu(nvml.sample(i), limits, sustained, now)]
        sample = nvml.sample(2)
        print(sample.pcie_width, sample.pcie_width_max, sample.pcie_gen, sample.pcie_gen_max, len(sample.nvlink_errors))
        print(findings(0.0))
        subprocess.run(["{sys.executable}", "-c", "from clusterctl_testbed.gpu_faults import Fault, inject; "
                        "from pathlib import Path; inject(Path({str(node)!r}), Fault('nvlink-errors', gpu=1, value=5))"],
                       check=True)
        print(findings(60.0))
    """)
    assert out.returncode == 0, out.stderr
    widths, first, second = out.stdout.splitlines()
    assert widths == "8 16 5 5 18"
    assert first == "[('pcie-degraded', 'gpu2 PCIe width x8 < x16')]"
    assert "('nvlink-errors', 'gpu1 nvlink 5 replay 1000.0/min > 60/min')" in second
    assert "('nvlink-errors', 'gpu1 nvlink 5 crc 1000.0/min > 60/min')" in second
