"""A testbed node's `dcgmi diag`: the command a site runs as its diagnostic, emulated per node.

The real interface, so healthd's real parser and runner are what the testbed exercises: the argv
`dcgmi diag -r N -j` (N = 1, 2, 3, 4), DCGM's JSON on stdout ({"DCGM GPU Diagnostic": {"test_categories":
[{"category", "tests": [{"name", "results": [{"gpu_ids", "status": "Pass"|"Fail"|..., "warnings"}]}]}],
"version"}}), exit 0 when every test passed and non-zero when one failed (DCGM_ST_NVVS_ERROR, -30, as an
exit byte: 226), 2 with a usage line for argv it does not know.

Each node has its own: `write_dcgmi(node_dir)` writes `nvml/<node>/bin/dcgmi`, a small script that runs
`main` for that node.  Faults are injected the way the NVML ones are (gpu_faults.py): lines in
`nvml/<node>/dcgm-diag` (`inject_diag`), read at every run:
  fail <level> <test> <gpu> <message...>   the test fails on that GPU from that run level up
  hang <seconds>                           the run sleeps that long first (a hung host engine)
  clear                                    (as a fault: empties the file)
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

FAULT_FILE = "dcgm-diag"
EXIT_TEST_FAILED = 226
"""dcgmi's exit when a test failed: DCGM_ST_NVVS_ERROR (-30) as an exit byte."""
EXIT_USAGE = 2
DCGM_VERSION = "3.3.9"
DEFAULT_GPUS = 8

# What each run level adds, as DCGM 3.x names its categories and tests (r4 adds the extended ones).
LEVEL_TESTS: tuple[tuple[int, str, str, bool], ...] = (
    # (from level, category, test, one result per GPU)
    (1, "Deployment", "Denylist", False), (1, "Deployment", "NVML Library", False),
    (1, "Deployment", "CUDA Main Library", False), (1, "Deployment", "Permissions and OS Blocks", False),
    (1, "Deployment", "Persistence Mode", False), (1, "Deployment", "Environment Variables", False),
    (1, "Deployment", "Page Retirement/Row Remap", False), (1, "Deployment", "Graphics Processes", False),
    (1, "Deployment", "Inforom", False),
    (2, "Integration", "PCIe", True), (2, "Hardware", "GPU Memory", True),
    (3, "Stress", "Targeted Stress", True), (3, "Stress", "Targeted Power", True),
    (3, "Stress", "Memory Bandwidth", True), (3, "Stress", "Diagnostic", True),
    (4, "Hardware", "Memtest", True), (4, "Hardware", "Pulse Test", True),
)


@dataclass(frozen=True)
class DiagFault:
    """One injected diagnostic fault: `test` fails on `gpu` from run `level` up; or the run hangs `seconds`."""

    kind: str  # "fail", "hang", "clear"
    level: int = 1
    test: str = "Diagnostic"
    gpu: int = 0
    message: str = "injected by clusterctl-testbed"
    seconds: float = 0.0

    def line(self) -> str:
        """The fault file's line for it."""
        if self.kind == "hang":
            return f"hang {self.seconds:g}"
        return f"fail {self.level} {self.test.replace(' ', '_')} {self.gpu} {self.message}"


def parse_faults(text: str) -> list[DiagFault]:
    """The fault file's lines (unknown or malformed ones ignored, as a driver ignores what it does not know)."""
    faults = []
    for raw in text.splitlines():
        words = raw.split()
        try:
            if words[:1] == ["fail"] and len(words) >= 4:
                faults.append(DiagFault("fail", int(words[1]), words[2].replace("_", " "), int(words[3]),
                                        " ".join(words[4:]) or "injected by clusterctl-testbed"))
            elif words[:1] == ["hang"] and len(words) == 2:
                faults.append(DiagFault("hang", seconds=float(words[1])))
        except ValueError:
            continue
    return faults


def diag_document(level: int, gpus: int, faults: Sequence[DiagFault]) -> tuple[str, int]:
    """`dcgmi diag -r <level> -j`'s stdout and exit code on a node with `gpus` GPUs and these faults."""
    failing = {(f.test, f.gpu): f.message for f in faults if f.kind == "fail" and f.level <= level}
    categories: dict[str, list[object]] = {}
    failed = False
    all_gpus = ",".join(str(i) for i in range(gpus))
    for since, category, test, per_gpu in LEVEL_TESTS:
        if since > level:
            continue
        results: list[dict[str, object]] = []
        for gpu in range(gpus) if per_gpu else [None]:
            message = failing.get((test, gpu)) if gpu is not None else next(
                (m for (name, _), m in failing.items() if name == test), None)
            result: dict[str, object] = {"gpu_ids": str(gpu) if gpu is not None else all_gpus,
                                         "status": "Fail" if message else "Pass"}
            if message:
                result["warnings"] = [{"warning": message, "error_id": 0, "error_category": 0, "error_severity": 1}]
                failed = True
            results.append(result)
        categories.setdefault(category, []).append({"name": test, "results": results})
    document = {"DCGM GPU Diagnostic": {
        "test_categories": [{"category": name, "tests": tests} for name, tests in categories.items()],
        "version": DCGM_VERSION}}
    return json.dumps(document, indent=4), EXIT_TEST_FAILED if failed else 0


def _gpus(node_dir: Path) -> int:
    try:
        for line in (node_dir / "state").read_text().splitlines():
            if line.startswith("gpus="):
                return int(line.split("=", 1)[1])
    except (OSError, ValueError):
        pass
    return int(os.environ.get("CLUSTERCTL_TESTBED_GPUS", DEFAULT_GPUS))


def main(argv: Sequence[str], node_dir: Path) -> int:
    """The emulated `dcgmi` for the node whose files are in `node_dir`."""
    if len(argv) != 4 or argv[0] != "diag" or argv[1] != "-r" or argv[3] != "-j" or argv[2] not in "1234" \
            or len(argv[2]) != 1:
        print("Usage: dcgmi diag -r <1|2|3|4> -j   (the testbed's dcgmi emulates only this)", file=sys.stderr)
        return EXIT_USAGE
    try:
        faults = parse_faults((node_dir / FAULT_FILE).read_text())
    except OSError:
        faults = []
    for fault in faults:
        if fault.kind == "hang":
            time.sleep(fault.seconds)
    text, code = diag_document(int(argv[2]), _gpus(node_dir), faults)
    print(text)
    return code


def write_dcgmi(node_dir: Path, python: str = sys.executable) -> Path:
    """Write `node_dir/bin/dcgmi`: this node's emulated dcgmi (healthd.toml's [diagnostics] runs it)."""
    script = node_dir / "bin" / "dcgmi"
    script.parent.mkdir(parents=True, exist_ok=True)
    package = Path(__file__).resolve().parent.parent
    script.write_text(f"#!{python}\n# Generated by clusterctl-testbed: this node's emulated dcgmi.\n"
                      f"import sys\nfrom pathlib import Path\nsys.path.insert(0, {str(package)!r})\n"
                      "from clusterctl_testbed.dcgmi_emu import main\n"
                      f"sys.exit(main(sys.argv[1:], Path({str(node_dir)!r})))\n")
    script.chmod(0o755)
    return script


def inject_diag(node_dir: Path, fault: DiagFault) -> None:
    """Add `fault` to the node's diagnostic faults (`clear`: remove them all); temp file + rename."""
    path = node_dir / FAULT_FILE
    current = path.read_text() if path.exists() else ""
    text = "" if fault.kind == "clear" else current + fault.line() + "\n"
    tmp = path.with_name(f".{FAULT_FILE}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
