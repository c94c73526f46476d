"""Bad input of every class the issue-18 probe found ends in one clear ClusterctlError, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterctl.errors import TopologyError
from clusterctl.slurm.topology import load_nvlink_domains, load_topology, parse_topology_conf


def test_a_topology_file_that_is_not_utf8_is_a_topology_error(tmp_path: Path) -> None:
    path = tmp_path / "topology.conf"
    path.write_bytes(b"SwitchName=s1 Nodes=n\xff[1-2]\n")
    with pytest.raises(TopologyError, match="not UTF-8"):
        load_topology(path)


def test_an_nvlink_domain_file_that_is_not_utf8_is_a_topology_error(tmp_path: Path) -> None:
    path = tmp_path / "nvl.toml"
    path.write_bytes(b'[[domain]]\nname = "r\xff"\nnodes = "n[1-2]"\n')
    with pytest.raises(TopologyError, match="not UTF-8"):
        load_nvlink_domains(path)


def test_a_deeply_nested_nvlink_domain_file_is_a_topology_error(tmp_path: Path) -> None:
    path = tmp_path / "nvl.toml"
    path.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(TopologyError, match="nested too deeply"):
        load_nvlink_domains(path)


def test_a_very_deep_switch_chain_is_refused_with_its_line() -> None:
    lines = ["SwitchName=s0 Nodes=n[1-2]"] + [f"SwitchName=s{i} Switches=s{i - 1}" for i in range(1, 5000)]
    with pytest.raises(TopologyError, match="more than 64 levels"):
        parse_topology_conf("\n".join(lines))


def test_a_deep_but_allowed_chain_walks_without_recursion() -> None:
    lines = ["SwitchName=s0 Nodes=n[1-2]"] + [f"SwitchName=s{i} Switches=s{i - 1}" for i in range(1, 60)]
    assert parse_topology_conf("\n".join(lines)).dfs_order() == ["n1", "n2"]


# ---- the job spec ----------------------------------------------------------------------
SPEC = """
[job]
name = "t"
nodes = 2
gpus_per_node = 8
{job}
[launch]
command = {command}
{launch}
[parallel]
{parallel}
[restart]
{restart}
"""


def spec_error(job: str = "", command: str = "['python3', 'train.py']", launch: str = "", parallel: str = "",
               restart: str = "") -> str:
    from clusterctl.errors import SpecError
    from clusterctl.launcher.pure.spec import parse_spec
    text = SPEC.format(job=job, command=command, launch=launch, parallel=parallel, restart=restart)
    with pytest.raises(SpecError) as caught:
        parse_spec(text, "job.toml", base_dir=Path("/tmp"))
    return str(caught.value)


@pytest.mark.parametrize("option", ["-N2", "-N 2", "--node=2", "--ntask=4", "-t10", "--part=gpu"])
def test_managed_sbatch_options_in_any_spelling_are_refused(option: str) -> None:
    assert "is set by clusterctl" in spec_error(job=f"sbatch_options = [{option!r}]")


def test_an_exact_sbatch_option_that_prefixes_a_managed_one_is_allowed() -> None:
    from clusterctl.launcher.pure.spec import managed_option
    assert managed_option("--gpus=8") is None and managed_option("--mem=0") is None


def test_tp_that_straddles_nodes_is_refused() -> None:
    from clusterctl.errors import SpecError
    from clusterctl.launcher.pure.spec import parse_spec
    text = SPEC.format(job="", command="['x']", launch="", parallel="tp = 3\npp = 1", restart="")
    text = text.replace("nodes = 2", "nodes = 3")  # 24 GPUs: tp=3 fills them, but 3 does not divide 8
    with pytest.raises(SpecError, match="does not divide the 8 GPUs of a node"):
        parse_spec(text, "job.toml", base_dir=Path("/tmp"))


@pytest.mark.parametrize("command, typo", [("['python3', 'train.py', '--out', '{run_dri}']", "{run_dri}"),
                                           ("['x', '--tp={TP}']", "{TP}"),
                                           ("['x', '{checkpoint_directory}']", "{checkpoint_directory}")])
def test_placeholder_typos_are_refused_not_passed_literally(command: str, typo: str) -> None:
    assert f"unknown placeholder {typo}" in spec_error(command=command)


def test_braces_that_are_no_placeholder_stay_as_written() -> None:
    from clusterctl.launcher.pure.spec import parse_spec
    text = SPEC.format(job="", command="['x', '{\"lr\": 1}', '{batch_size}']", launch="", parallel="", restart="")
    assert parse_spec(text, "job.toml", base_dir=Path("/tmp")).launch.command[1:] == ('{"lr": 1}', "{batch_size}")


@pytest.mark.parametrize("job, restart, expected", [
    ("spare_nodes = 100000000000000000000", "", "at most"),
    ("", "poll_seconds = nan", "a finite number"),
    ("", "blame_hours = inf", "a finite number"),
    ("", "backoff_seconds = 1e300", "at most"),
    ("", "max_restarts = 99999999999", "at most"),
])
def test_sizes_have_an_upper_bound(job: str, restart: str, expected: str) -> None:
    assert expected in spec_error(job=job, restart=restart)


def test_a_node_count_with_no_upper_bound_is_refused_on_the_command_line_too() -> None:
    from clusterctl.errors import SpecError
    from clusterctl.launcher.pure.spec import parse_overrides
    with pytest.raises(SpecError, match="at most 100,000"):
        parse_overrides(nodes=10**12)


def test_a_deeply_nested_spec_is_a_spec_error() -> None:
    from clusterctl.errors import SpecError
    from clusterctl.launcher.pure.spec import parse_spec
    with pytest.raises(SpecError, match="nested too deeply"):
        parse_spec("x = " + "[" * 100_000 + "]" * 100_000, "job.toml")


def test_a_template_that_is_not_utf8_is_a_spec_error(tmp_path: Path) -> None:
    from clusterctl.errors import SpecError
    from clusterctl.launcher.pure.spec import parse_spec
    from clusterctl.launcher.login.submit import load_template
    (tmp_path / "t.sbatch").write_bytes(b"#!/bin/bash\n\xff\xfe\n")
    spec = parse_spec(SPEC.format(job="", command="['x']", launch="template = 't.sbatch'", parallel="", restart=""),
                      "job.toml", base_dir=tmp_path)
    with pytest.raises(SpecError, match="not UTF-8"):
        load_template(spec)


@pytest.mark.parametrize("line", ["BlockName=b1 Nodes=n[1-2] BlockSize=\u00b2", "BlockSizes=\u0662,4",
                                  "BlockName=b1 Nodes=n[1-2] BlockSize=99999999999999999999999"])
def test_block_sizes_in_other_digits_or_huge_are_topology_errors(line: str) -> None:
    from clusterctl.slurm.topology import parse_topology
    with pytest.raises(TopologyError):
        parse_topology(line + "\nBlockName=b2 Nodes=n[3-4]\n", "topology.conf")
