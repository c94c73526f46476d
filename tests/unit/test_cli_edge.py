"""The command line's edge: every error family has its own exit code and one line; nothing else
(a bad output path, a damaged run among many, a refused sbatch, a supervisor that cannot start)
ends in a traceback or leaves a half-made run behind."""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import clusterctl
from clusterctl.errors import INTERNAL_ERROR_EXIT, ClusterctlError
from clusterctl.healthd.cli import cli as healthd_cli
from clusterctl.launcher.login.cli import cli, main
from clusterctl.launcher.shared.runs import create_run
from clusterctl.launcher.pure.spec import load_spec
from clusterctl.records.run_journal import Submitted
from tests.conftest import REPO

TOPOLOGY = str(REPO / "tests" / "data" / "slurm" / "topology.conf")


def every_family() -> list[type[ClusterctlError]]:
    for module in pkgutil.walk_packages(clusterctl.__path__, "clusterctl."):
        if ".testbed" not in module.name and not module.name.endswith("__main__"):
            try:
                importlib.import_module(module.name)
            except ImportError:  # optional dependencies (NVML) of the node side
                continue
    found, todo = [], [ClusterctlError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def run_main(monkeypatch, capsys, *argv: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["clusterctl", *argv])
    with pytest.raises(SystemExit) as exited:
        main()
    return int(exited.value.code or 0), capsys.readouterr().err


def test_every_error_family_has_its_own_exit_code_named_in_the_help():
    families = every_family()
    by_code: dict[int, type] = {}
    for cls in families:
        parent_codes = {base.exit_code for base in cls.__mro__[1:] if issubclass(base, ClusterctlError)}
        if cls.exit_code in parent_codes and cls is not ClusterctlError:
            continue  # a finer kind of its family (SlurmVersionError is a SlurmCommandError)
        assert cls.exit_code not in by_code, f"{cls.__name__} and {by_code[cls.exit_code].__name__} share an exit code"
        by_code[cls.exit_code] = cls
    assert len(by_code) >= 11
    # Each family is explained by the command line that reports it: healthd's own by `healthd --help`.
    helps = {"clusterctl": CliRunner().invoke(cli, ["--help"]).output,
             "healthd": CliRunner().invoke(healthd_cli, ["--help"]).output}
    for code, cls in by_code.items():
        which = "healthd" if cls.__module__.startswith("clusterctl.healthd.") else "clusterctl"
        if code != 1:
            assert f"{code} " in helps[which].replace("\n", " "), f"exit code {code} is not explained in {which} --help"


def test_the_edge_maps_each_family_to_its_code_with_one_line(monkeypatch, capsys):
    families = every_family()

    @cli.command("raise-for-test", hidden=True)
    @click.argument("name")
    def raise_for_test(name: str) -> None:
        cls = next(c for c in families if c.__name__ == name)
        error = cls.__new__(cls)
        Exception.__init__(error, f"{name} happened; do this next")
        raise error

    try:
        for cls in families:
            code, err = run_main(monkeypatch, capsys, "raise-for-test", cls.__name__)
            assert code == cls.exit_code
            assert err == f"clusterctl: error: {cls.__name__} happened; do this next\n"
    finally:
        cli.commands.pop("raise-for-test")


def test_a_bug_is_one_line_and_its_own_exit_code(monkeypatch, capsys):
    @cli.command("bug-for-test", hidden=True)
    def bug_for_test() -> None:
        {}["missing"]  # noqa: B018 - the bug

    try:
        code, err = run_main(monkeypatch, capsys, "bug-for-test")
    finally:
        cli.commands.pop("bug-for-test")
    assert code == INTERNAL_ERROR_EXIT
    assert err.count("\n") == 1 and "internal error: KeyError" in err and "Traceback" not in err


@pytest.mark.parametrize(("where", "why"), [("afile/x.svg", "(Not a directory)"), ("/proc/x.svg", "")])
def test_an_svg_that_cannot_be_written_is_exit_12(tmp_path, monkeypatch, capsys, where, why):
    (tmp_path / "afile").write_text("")
    monkeypatch.chdir(tmp_path)
    code, err = run_main(monkeypatch, capsys, "plan", "--tp", "2", "--topology", TOPOLOGY, "--nodelist", "node[1-4]",
                         "--svg", where)
    assert code == 12 and err.startswith(f"clusterctl: error: --svg {where}: cannot write it {why}") \
        and err.count("\n") == 1


def test_a_run_dir_under_a_file_is_refused_by_the_dry_run_already(tmp_path, monkeypatch, capsys):
    (tmp_path / "afile").write_text("")
    code, err = run_main(monkeypatch, capsys, "submit", str(REPO / "examples" / "toy_trainer.toml"), "--dry-run",
                         "--run-dir", str(tmp_path / "afile" / "run"))
    assert code == 12 and "is not a directory; pass another --run-dir" in err


@pytest.mark.parametrize("option", [["--nodes", "0"], ["--tp", "0"], ["--weight", "dp=nan"], ["--weight", "dp=-1"]])
def test_plan_sizes_and_weights_out_of_range_are_usage_errors(monkeypatch, capsys, option):
    code, err = run_main(monkeypatch, capsys, "plan", "--topology", TOPOLOGY, "--nodelist", "node[1-4]", *option)
    assert code == 2 and "Invalid value" in err


def make_runs(root: Path) -> None:
    spec = load_spec(REPO / "examples" / "toy_trainer.toml")
    good = create_run(root / "good", spec, "")
    good.record(Submitted(at=good.now(), attempt=1, job_id="4242"))
    damaged = create_run(root / "damaged", spec, "")
    with open(damaged.journal_path, "a") as journal:
        journal.write(json.dumps({"kind": "run-event", "version": 1, "event": "submitted", "at": 1.0,
                                  "attempt": "one", "job_id": "4242"}) + "\n")


def test_one_damaged_run_does_not_hide_the_others_jobs(tmp_path):
    from clusterctl.launcher.shared.runs import find_run_of_job
    make_runs(tmp_path)
    found = find_run_of_job(tmp_path, "4242")
    assert found is not None and found.path.name == "good"


def test_listing_runs_skips_a_damaged_one_with_a_note(tmp_path):
    from clusterctl.launcher.shared.runs import list_runs
    from clusterctl.launcher.login.use_cases import gather_status
    from clusterctl.slurm.commands import Completed, Slurm
    make_runs(tmp_path)

    def runner(argv, timeout):
        if argv[0] == "sbatch":
            return Completed(0, "slurm-wlm 22.05.8\n", "")
        return Completed(0, json.dumps({"jobs": []}), "")
    notes: list[str] = []
    statuses = gather_status(list_runs(tmp_path), Slurm(runner), notes.append, skip_damaged=True)
    assert [s.run.name for s in statuses] == ["good"]
    assert len(notes) == 1 and "skipping a run" in notes[0] and "damaged/journal.jsonl" in notes[0]


def test_a_refused_sbatch_leaves_no_run_directory(tmp_path):
    from clusterctl.errors import SlurmCommandError
    from clusterctl.launcher.login.use_cases import create_submission_run, prepare_submission, submit_first_attempt
    from clusterctl.slurm.commands import Completed, Slurm

    def runner(argv, timeout):
        if argv[:2] == ["sbatch", "--version"]:
            return Completed(0, "slurm-wlm 22.05.8\n", "")
        if argv[0] == "sbatch":
            return Completed(1, "", "sbatch: error: Batch job submission failed: Invalid account")
        return Completed(0, "", "")
    spec = load_spec(REPO / "examples" / "toy_trainer.toml")
    slurm = Slurm(runner)
    submission = prepare_submission(spec, slurm, run_dir=tmp_path / "run", now=0.0, python="/py", resume_from=None,
                                    supervise=False)
    run = create_submission_run(submission, "")
    with pytest.raises(SlurmCommandError, match="Invalid account"):
        submit_first_attempt(run, submission, slurm)
    assert not (tmp_path / "run").exists()


def test_a_background_supervisor_that_dies_at_once_is_reported_not_called_supervising(tmp_path, monkeypatch, capsys):
    spec = load_spec(REPO / "examples" / "toy_trainer.toml")
    run = create_run(tmp_path / "run", spec, "")
    (run.path / "spec.json").write_text("[]")  # it cannot read its run
    code, err = run_main(monkeypatch, capsys, "supervise", "--detach", str(run.path))
    assert code == 9
    assert "the background supervisor exited at once (exit 10)" in err and "spec.json" in err


@pytest.mark.parametrize("argv", [["submit", str(REPO / "examples" / "toy_trainer.toml"), "--dry-run", "--nodes", "\u0663"],
                                  ["submit", str(REPO / "examples" / "toy_trainer.toml"), "--dry-run", "--nodes", "1_0"],
                                  ["plan", "--topology", TOPOLOGY, "--nodelist", "node[1-4]", "--tp", "\u0662"]])
def test_sizes_must_be_written_in_ascii_digits(monkeypatch, capsys, argv):
    code, err = run_main(monkeypatch, capsys, *argv)
    assert code == 2 and "is not a whole number (ASCII digits)" in err


def test_a_time_in_other_digits_is_a_spec_error(monkeypatch, capsys):
    code, err = run_main(monkeypatch, capsys, "submit", str(REPO / "examples" / "toy_trainer.toml"), "--dry-run",
                         "--time", "\u0661:\u0660\u0660")
    assert code == 7 and "a Slurm time" in err


def test_a_resume_path_with_a_newline_is_refused(monkeypatch, capsys):
    code, err = run_main(monkeypatch, capsys, "submit", str(REPO / "examples" / "toy_trainer.toml"), "--dry-run",
                         "--resume", "ckpt\nrm -rf ~")
    assert code == 2 and "without control characters" in err


def test_a_spec_path_that_cannot_be_followed_is_a_spec_error(tmp_path, monkeypatch, capsys):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    spec = tmp_path / "job.toml"
    spec.write_text('[job]\nname = "t"\nnodes = 1\n[launch]\ncommand = ["x"]\n[checkpoint]\ndir = "loop/x"\n')
    code, err = run_main(monkeypatch, capsys, "spec", str(spec))
    assert code == 7 and "checkpoint.dir" in err and "cannot follow the path" in err


def test_detaching_from_a_run_that_already_ended_says_so(tmp_path, monkeypatch, capsys):
    from clusterctl.records.run_journal import EventKind, RunEnded
    run = create_run(tmp_path / "run", load_spec(REPO / "examples" / "toy_trainer.toml"), "")
    run.record(RunEnded(kind=EventKind.DONE, at=run.now(), message="all steps done"))
    monkeypatch.setattr(sys, "argv", ["clusterctl", "supervise", "--detach", str(run.path)])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("the supervisor finished at once:") and "run done: all steps done" in out


def test_an_error_naming_outside_text_shows_its_control_characters_escaped(monkeypatch, capsys, tmp_path):
    planted = tmp_path / "run\x1b]0;owned\x07\x1b[2J"
    planted.mkdir()
    code, err = run_main(monkeypatch, capsys, "status", str(planted))
    assert code != 0 and err.count("\n") == 1
    assert "\x1b" not in err and "\x07" not in err and "\\x1b]0;owned\\x07\\x1b[2J" in err


def test_a_spec_json_too_large_to_be_ours_is_refused_without_reading_it_all(monkeypatch, capsys, tmp_path):
    spec_path = REPO / "examples" / "toy_trainer.toml"
    run = create_run(tmp_path / "run", load_spec(spec_path), spec_path.read_text())
    (run.path / "spec.json").write_bytes(b" " * (5 << 20))
    code, err = run_main(monkeypatch, capsys, "report", str(run.path))
    assert code != 0 and err.count("\n") == 1
    assert err.startswith(f"clusterctl: error: {run.path / 'spec.json'}: ") and "more than" in err
