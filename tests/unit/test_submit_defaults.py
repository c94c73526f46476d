"""Site and user defaults for `clusterctl submit` (account, partition, qos, constraint), --qos and
--sbatch-option, as a user sees them: the sbatch command a dry run prints."""

from __future__ import annotations

import json
import sys
from io import StringIO
from pathlib import Path
from unittest import mock

import pytest
import clusterctl.launcher.login.cli as cli_module
from clusterctl.errors import SpecError
from clusterctl.launcher.login.submit import load_template
from clusterctl.launcher.pure.render import SlurmFacts, prepare
from clusterctl.launcher.pure.spec import parse_overrides, parse_spec
from clusterctl.launcher.pure.submit_defaults import defaults_files, merged_defaults
from clusterctl.slurm.commands import Slurm
from clusterctl.slurm.topology import parse_scontrol_topology
from clusterctl.slurm.version import SlurmVersion
from tests.conftest import REPO
from tests.golden import assert_golden
from tests.unit.test_submit_cli import RecordedSlurm

EXAMPLE = REPO / "examples" / "toy_trainer.toml"
SITE = '[job]\naccount = "ml-site"\npartition = "gpu"\nqos = "normal"\nconstraint = "h100"\n'
USER = '[job]\nqos = "mine"\n'


@pytest.fixture
def homes(monkeypatch, tmp_path):
    """A site file and a user config home of this test's own; Slurm replayed."""
    site = tmp_path / "etc" / "clusterctl.toml"
    site.parent.mkdir()
    monkeypatch.setenv("CLUSTERCTL_SITE_CONFIG", str(site))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("CLUSTERCTL_RUNS", str(tmp_path / "runs"))
    monkeypatch.setattr(cli_module, "Slurm", lambda: Slurm(RecordedSlurm()))
    user = tmp_path / "xdg" / "clusterctl" / "config.toml"
    user.parent.mkdir(parents=True)
    return site, user


def _dry_run(tmp_path: Path, *args: str, spec: Path = EXAMPLE) -> tuple[int, list[str], str]:
    """`clusterctl submit SPEC --dry-run --json ARGS` as the installed command runs it: exit code, sbatch argv, output."""
    argv = ["clusterctl", "submit", str(spec), "--dry-run", "--json", "--run-dir", str(tmp_path / "r"), *args]
    out, err = StringIO(), StringIO()
    code = 0
    with mock.patch.object(sys, "argv", argv), mock.patch.object(sys, "stdout", out), mock.patch.object(sys, "stderr", err):
        try:
            cli_module.main()
        except SystemExit as exc:
            code = int(exc.code or 0)
    sbatch = json.loads(out.getvalue())["sbatch_argv"] if code == 0 else []
    return code, sbatch, out.getvalue() + err.getvalue()


def test_site_then_user_then_spec_then_command_line(homes, tmp_path):
    site, user = homes
    site.write_text(SITE)
    user.write_text(USER)
    spec = tmp_path / "job.toml"
    spec.write_text(EXAMPLE.read_text().replace('time = "10:00"', 'time = "10:00"\npartition = "big"'))
    (tmp_path / "toy_trainer.py").write_text("")
    code, argv, output = _dry_run(tmp_path, "--qos", "high", spec=spec)
    assert code == 0, output
    assert "--account=ml-site" in argv and "--constraint=h100" in argv  # the site's, nobody else sets them
    assert "--partition=big" in argv  # the spec over the site
    assert "--qos=high" in argv and "--qos=mine" not in argv  # the command line over the user over the site
    code, argv, _ = _dry_run(tmp_path, spec=spec)
    assert "--qos=mine" in argv


def test_without_either_file_nothing_is_added(homes, tmp_path):
    code, argv, output = _dry_run(tmp_path)
    assert code == 0, output
    assert not [a for a in argv if a.startswith(("--account", "--partition", "--qos", "--constraint"))]


def test_sbatch_options_from_the_command_line_follow_the_specs(homes, tmp_path):
    code, argv, output = _dry_run(tmp_path, "--sbatch-option", "mem=0", "--sbatch-option", "exclusive")
    assert code == 0, output
    assert argv[-3:-1] == ["--mem=0", "--exclusive"]


@pytest.mark.parametrize(("option", "says"), [
    ("nodes=4", "--nodes is set by clusterctl"), ("--time=1:00", "--time is set by clusterctl"),
    ("bad key=1", "expected KEY=VALUE"), ("mem=0\nx", "expected KEY=VALUE"),
])
def test_a_bad_sbatch_option_is_one_line_naming_the_option(homes, tmp_path, option, says):
    code, _, output = _dry_run(tmp_path, "--sbatch-option", option)
    assert code == 7 and "--sbatch-option" in output and says in output and "Traceback" not in output


@pytest.mark.parametrize(("text", "says"), [
    ('[job]\naccont = "x"\n', "key `job.accont`: unknown key; defaults may set account, partition, qos, constraint"),
    ('[job]\nnodes = 4\n', "key `job.nodes`: belongs in each job's spec"),
    ('[submit]\nqos = "x"\n', "key `submit`: unknown table"),
    ('[job]\nqos = 3\n', "job.qos"),
    ('[job]\nqos = "a\\nb"\n', "without control characters"),
    ("[job\n", "not valid TOML"),
])
def test_a_bad_defaults_file_names_the_file_and_key(homes, tmp_path, text, says):
    _, user = homes
    user.write_text(text)
    code, _, output = _dry_run(tmp_path)
    assert code == 7 and str(user) in output and says in output and "Traceback" not in output


def test_a_bad_value_names_its_line():
    with pytest.raises(SpecError, match=r"site\.toml:3, key `job.qos`"):
        merged_defaults([("site.toml", '[job]\naccount = "a"\nqos = ""\n')])


def test_xdg_config_home_is_respected_and_a_relative_one_ignored(tmp_path):
    assert defaults_files({"XDG_CONFIG_HOME": "/x"}, tmp_path)[1] == Path("/x/clusterctl/config.toml")
    assert defaults_files({"XDG_CONFIG_HOME": "rel"}, tmp_path)[1] == tmp_path / ".config/clusterctl/config.toml"
    assert defaults_files({}, tmp_path)[0] == Path("/etc/clusterctl/clusterctl.toml")


def test_site_defaults_in_the_sbatch_command_golden():
    defaults = merged_defaults([("/etc/clusterctl/clusterctl.toml", SITE), ("~/.config/clusterctl/config.toml", USER)])
    overrides = parse_overrides(sbatch_options=["mem=0"], defaults=defaults)
    spec = parse_spec(EXAMPLE.read_text(), "toy.toml", overrides, base_dir=REPO / "examples")
    facts = SlurmFacts(SlurmVersion(22, 5, 8), None, parse_scontrol_topology(
        (REPO / "tests/data/slurm/scontrol-show-topology.txt").read_text()))
    request = prepare(spec, load_template(spec), facts, run_dir="/runs/toy-1", python="/usr/bin/python3")
    argv = [a.replace(str(REPO), "<repo>") for a in request.sbatch_argv]
    assert_golden("submit/srun-site-defaults.argv.json", json.dumps(argv, indent=2) + "\n")
