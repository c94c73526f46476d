"""`clusterctl plan` and `clusterctl hostlist` as a user runs them: golden JSON, clear errors, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from clusterctl.launcher.login.cli import cli
from tests.golden import assert_golden

DATA = Path(__file__).resolve().parents[1] / "data"
GOLDEN = DATA / "golden" / "plan"

CASES = {
    # The testbed's real `scontrol show topology`: 3 of its 4 nodes, PP across nodes.
    "testbed-tp8-pp3": ["--tp", "8", "--pp", "3", "--topology", str(DATA / "slurm" / "scontrol-show-topology.txt"),
                        "--nodelist", "node[1-4]", "--nodes", "3"],
    "testbed-tp8-pp2-dp2": ["--tp", "8", "--pp", "2", "--topology", str(DATA / "slurm" / "topology-addr.txt"),
                            "--nodelist", "node[1-4]"],
    "fragmented-tp4-pp4": ["--tp", "4", "--pp", "4", "--topology", str(DATA / "slurm" / "fragmented-topology.conf"),
                           "--nodelist", "gpu[002-004,009,011-014,018,020-021,025-029]", "--nodes", "16"],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_plan_json_matches_golden(name):
    result = CliRunner().invoke(cli, ["plan", *CASES[name], "--json"])
    assert result.exit_code == 0, result.output
    assert_golden(f"plan/{name}.json", result.output)
    data = json.loads(result.output)
    assert data["cost"]["objective"] <= data["baselines"]["dfs"]["objective"]


def test_plan_prints_a_tree_a_cost_table_and_why(tmp_path):
    svg = tmp_path / "plan.svg"
    result = CliRunner().invoke(cli, ["plan", *CASES["fragmented-tp4-pp4"], "--explain", "--svg", str(svg)])
    assert result.exit_code == 0, result.output
    assert "core" in result.output and "leaf-crossing DP+PP groups" in result.output and "Why:" in result.output
    assert svg.read_text().startswith("<svg") and svg.read_text().count("<rect") == 16


SPEC = '[job]\nname = "x"\nnodes = 2\n[launch]\ncommand = ["train"]\n[parallel]\ntp = 8\npp = 2\norder = "megatron"\n'


def _plan_spec(tmp_path: Path, *extra: str) -> dict:
    spec = tmp_path / "job.toml"
    spec.write_text(SPEC)
    result = CliRunner().invoke(cli, ["plan", "--spec", str(spec), "--topology", str(DATA / "slurm" / "topology.conf"),
                                      "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_plan_of_a_spec_fills_dp_for_the_nodes_planned(tmp_path):
    assert _plan_spec(tmp_path, "--nodelist", "node[1-4]")["layout"]["dp"] == 2  # 4 nodes × 8 / (tp 8 × pp 2)


def test_plan_options_override_the_specs_layout(tmp_path):
    layout = _plan_spec(tmp_path, "--nodelist", "node[1-4]", "--pp", "4")["layout"]
    assert (layout["tp"], layout["pp"], layout["dp"]) == (8, 4, 1)


def test_plan_of_a_spec_refuses_what_the_spec_loader_refuses(tmp_path):
    spec = tmp_path / "job.toml"
    spec.write_text(SPEC.replace("pp = 2", "pp = 3"))
    out = subprocess.run([str(Path(sys.executable).parent / "clusterctl"), "plan", "--spec", str(spec), "--topology",
                          str(DATA / "slurm" / "topology.conf"), "--nodelist", "node[1-4]"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 7 and "tp×cp×pp = 24 does not divide the job's 32 GPUs" in out.stderr


@pytest.mark.parametrize("args, code, message", [
    (["--tp", "8", "--pp", "3", "--nodelist", "node[1-4]"], 5, "tp×cp×pp = 24 does not divide 32 GPUs"),
    (["--tp", "16", "--nodelist", "node[1-4]"], 5, "tp = 16 GPUs must share one NVLink domain"),
    (["--tp", "8", "--nodelist", "node[1-3],node9"], 6, "nodes not in the topology"),
    (["--tp", "8", "--nodelist", "node[1-"], 3, "'[' is never closed"),
    (["--tp", "8", "--order", "tp-zz", "--nodelist", "node[1-4]"], 5, "order 'tp-zz' must be a framework"),
])
def test_bad_input_is_one_clear_line_with_its_own_exit_code(args, code, message):
    runner = CliRunner()
    result = runner.invoke(cli, ["plan", *args, "--topology", str(DATA / "slurm" / "topology.conf")])
    assert result.exit_code != 0
    # Through main(): the exit code of the error family and no traceback.
    out = subprocess.run([str(Path(sys.executable).parent / "clusterctl"), "plan", *args, "--topology",
                          str(DATA / "slurm" / "topology.conf")], capture_output=True, text=True, timeout=60)
    assert out.returncode == code, out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr
    assert out.stderr.startswith("clusterctl: error: ")


def test_malformed_topology_names_file_and_line(tmp_path):
    bad = tmp_path / "topology.conf"
    bad.write_text("SwitchName=l1 Nodes=n[1-2]\nSwitchName=s Switches=l1 l2\n")
    out = subprocess.run([str(Path(sys.executable).parent / "clusterctl"), "plan", "--tp", "8", "--topology",
                          str(bad), "--nodelist", "n[1-2]"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 4
    assert f"{bad}:2: expected Key=Value, found 'l2'" in out.stderr


def test_hostlist_commands():
    assert CliRunner().invoke(cli, ["hostlist", "expand", "n[01-03],x"]).output == "n01\nn02\nn03\nx\n"
    assert CliRunner().invoke(cli, ["hostlist", "compress", "n1", "n2", "n3", "n5"]).output == "n[1-3,5]\n"
