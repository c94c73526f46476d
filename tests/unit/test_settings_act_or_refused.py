"""Every spec key acts or is refused; names, times and hostlists that Slurm would choke on are refused
before anything is submitted, with the key and what to write instead (issue 27)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterctl.errors import HostlistError, SlurmCommandError, SpecError
from clusterctl.launcher.login.cli import cli, main
from clusterctl.launcher.login.submit import load_template
from clusterctl.launcher.pure.render import SlurmFacts, prepare
from clusterctl.launcher.pure.spec import MAX_JOB_NAME_BYTES, SRUN_INPUT_VARIABLES, parse_spec, slurm_time_seconds
from clusterctl.slurm.commands import Completed, Slurm, subprocess_runner
from clusterctl.slurm.hostlist import compress, expand

SPEC = """\
[job]
name = "llm"
nodes = 2

[launch]
command = ["python3", "train.py"]
"""


def run_main(monkeypatch, capsys, *argv: str) -> tuple[int, str]:
    """The installed command's edge: each error family's exit code and its one-line message."""
    monkeypatch.setattr(sys, "argv", ["clusterctl", *argv])
    with pytest.raises(SystemExit) as exited:
        main()
    return int(exited.value.code or 0), capsys.readouterr().err


def write_spec(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


def _error(text: str) -> str:
    with pytest.raises(SpecError) as caught:
        parse_spec(text, "job.toml", base_dir=Path("/base"))
    return str(caught.value)


# ---- launch.python acts -------------------------------------------------------------------------
def test_launch_python_is_the_python_the_script_runs():
    spec = parse_spec(SPEC.replace('command = ', 'python = "/shared/venv/bin/python3"\ncommand = '), "job.toml",
                      base_dir=Path("/base"))
    script = prepare(spec, load_template(spec), SlurmFacts(), run_dir="/runs/r", python="/login/python").script
    assert "python=/shared/venv/bin/python3\n" in script and "/login/python" not in script


def test_without_launch_python_the_script_runs_the_submitting_python():
    spec = parse_spec(SPEC, "job.toml", base_dir=Path("/base"))
    script = prepare(spec, load_template(spec), SlurmFacts(), run_dir="/runs/r", python="/login/python").script
    assert "python=/login/python\n" in script


# ---- {checkpoint_dir} needs [checkpoint] dir ----------------------------------------------------
def test_checkpoint_dir_placeholder_without_a_checkpoint_dir_is_refused():
    message = _error(SPEC.replace('"train.py"]', '"train.py", "--save", "{checkpoint_dir}"]'))
    assert message.startswith("job.toml:6, key `launch.command`: uses {checkpoint_dir}, but [checkpoint] dir is not set")
    assert "set checkpoint.dir" in message


def test_checkpoint_dir_placeholder_with_a_checkpoint_dir_is_filled():
    spec = parse_spec(SPEC.replace('"train.py"]', '"train.py", "--save={checkpoint_dir}"]')
                      + '[checkpoint]\ndir = "{run_dir}/ck"\n', "job.toml", base_dir=Path("/base"))
    from dataclasses import replace

    from clusterctl.launcher.pure.render import launch_command
    assert "--save=/runs/r/ck" in launch_command(spec, "/runs/r", None)  # what the agent starts each rank with
    torchrun = replace(spec, launch=replace(spec.launch, style="torchrun"))
    assert "--save=/runs/r/ck" in prepare(torchrun, load_template(torchrun), SlurmFacts(), run_dir="/runs/r",
                                          python="p").command


# ---- {total_steps} needs [job] total_steps ------------------------------------------------------
def test_total_steps_placeholder_without_a_total_is_refused_and_with_one_is_the_same_number():
    message = _error(SPEC.replace('"train.py"]', '"train.py", "--steps", "{total_steps}"]'))
    assert "key `launch.command`: uses {total_steps}, but [job] total_steps is not set" in message
    spec = parse_spec(SPEC.replace('"train.py"]', '"train.py", "--steps", "{total_steps}"]').replace(
        "[job]\n", "[job]\ntotal_steps = 5000\n"), "job.toml", base_dir=Path("/base"))
    from clusterctl.launcher.pure.render import launch_command
    assert launch_command(spec, "/runs/r", None)[-2:] == ["--steps", "5000"]


# ---- spec --markdown SPEC -----------------------------------------------------------------------
def test_spec_markdown_with_a_spec_file_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(cli, ["spec", "--markdown", str(write_spec(tmp_path, SPEC))])
    assert result.exit_code == 2 and "--markdown prints the reference, not a spec" in result.output


def test_spec_markdown_alone_still_prints_the_reference():
    result = CliRunner().invoke(cli, ["spec", "--markdown"])
    assert result.exit_code == 0 and result.output.startswith("| key | type | default | meaning |")


# ---- job names ----------------------------------------------------------------------------------
def test_a_very_long_job_name_is_refused_by_the_dry_run(tmp_path, monkeypatch, capsys):
    spec = write_spec(tmp_path, SPEC.replace('"llm"', '"' + "n" * 300 + '"'))
    code, err = run_main(monkeypatch, capsys, "submit", str(spec), "--dry-run", "--run-dir", str(tmp_path / "r"))
    assert code == 7 and f"key `job.name`: expected a name of at most {MAX_JOB_NAME_BYTES} bytes" in err


def test_a_long_name_override_is_refused_too(tmp_path, monkeypatch, capsys):
    code, err = run_main(monkeypatch, capsys, "submit", str(write_spec(tmp_path, SPEC)), "--dry-run",
                         "--run-dir", str(tmp_path / "r"), "--name", "é" * 200)  # 400 bytes
    assert code == 7 and "command line, key `--name`: expected a name of at most 255 bytes" in err


def test_a_name_of_255_bytes_is_accepted():
    assert parse_spec(SPEC.replace('"llm"', '"' + "n" * 255 + '"'), "job.toml", base_dir=Path("/")).job.name


@pytest.mark.parametrize("char", ["\\u007f", "\\u0085", "\\u001b", "\\t"])
def test_names_with_control_characters_are_refused(char):
    assert "key `job.name`: expected a string without control characters" in _error(
        SPEC.replace('"llm"', f'"ab{char}c"'))


def test_an_argv_too_long_for_the_kernel_is_a_slurm_command_error_not_a_crash():
    with pytest.raises(SlurmCommandError, match="Argument list too long"):
        subprocess_runner(["true", "x" * 300_000], 5)


# ---- times --------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, unit", [("1:99:99", "minutes"), ("1:00:60", "seconds"), ("90:60", "seconds"),
                                        ("2-24", "hours"), ("2-1:60", "minutes"), ("1-00:00:99", "seconds")])
def test_times_with_a_field_out_of_range_are_refused(text, unit):
    message = _error(SPEC.replace("nodes = 2", f'nodes = 2\ntime = "{text}"'))
    assert f"key `job.time`: expected a Slurm time with {unit} from 0 to" in message


@pytest.mark.parametrize("text, seconds", [("90", 5400), ("90:30", 5430), ("48:00:00", 172800), ("2-12", 216000),
                                           ("2-12:30", 217800), ("1-00:00:01", 86401), ("0", 0),
                                           ("UNLIMITED", None)])
def test_times_in_every_slurm_shape_read_as_slurm_reads_them(text, seconds):
    assert slurm_time_seconds(text) == seconds


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=20) | st.from_regex(r"[0-9]{1,3}(-[0-9]{1,3})?(:[0-9]{1,3}){0,3}", fullmatch=True))
def test_any_text_is_a_time_or_a_clear_refusal(text):
    try:
        seconds = slurm_time_seconds(text)
    except ValueError as exc:
        assert str(exc).startswith("a Slurm time")
        return
    assert seconds is None or seconds >= 0


@given(st.integers(0, 999), st.integers(0, 23), st.integers(0, 59), st.integers(0, 59))
def test_every_valid_time_reads_back_its_seconds(days, hours, minutes, seconds):
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    assert slurm_time_seconds(f"{days}-{hours:02d}:{minutes:02d}:{seconds:02d}") == total
    assert slurm_time_seconds(f"{days * 24 + hours}:{minutes}:{seconds:02d}") == total


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=20))
def test_any_time_in_a_spec_is_accepted_or_a_spec_error(text):
    toml = '"' + "".join(f"\\U{ord(c):08X}" for c in text) + '"'
    try:
        spec = parse_spec(SPEC.replace("nodes = 2", f"nodes = 2\ntime = {toml}"), "job.toml", base_dir=Path("/"))
    except SpecError as exc:
        assert "key `job.time`" in str(exc)
        return
    assert slurm_time_seconds(spec.job.time or "") is None or spec.job.time == text


# ---- hostlists ----------------------------------------------------------------------------------
@pytest.mark.parametrize("expression", ["", ",", " , ", "\n"])
def test_hostlist_expand_of_no_host_is_refused(monkeypatch, capsys, expression):
    code, err = run_main(monkeypatch, capsys, "hostlist", "expand", expression)
    assert code == 3 and "names no host; give at least one" in err


@pytest.mark.parametrize("expression", ["node\x7f1", "node[1-2],\x1b[2Jx", "n\x00"])
def test_hostlist_expand_refuses_control_characters(monkeypatch, capsys, expression):
    code, err = run_main(monkeypatch, capsys, "hostlist", "expand", expression)
    assert code == 3 and "control character" in err


def test_hostlist_compress_refuses_control_characters(monkeypatch, capsys):
    code, err = run_main(monkeypatch, capsys, "hostlist", "compress", "node1", "node\x7f2")
    assert code == 3 and "is not a host name" in err


def test_an_exclude_naming_no_host_is_refused():
    assert "key `job.exclude`: expected a Slurm hostlist" in _error(SPEC.replace("nodes = 2", 'nodes = 2\nexclude = ","'))


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=st.sampled_from("n0123456789[]-, \t\n\x7f\x00\x1b\u0663a.") | st.characters(), max_size=24))
def test_any_text_expands_to_names_or_a_hostlist_error(expression):
    try:
        names = expand(expression)
    except HostlistError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert names and all(name and not any(c in name for c in ",[] \t\n\x7f") for name in names)
    assert all(ord(c) >= 32 for name in names for c in name)
    assert expand(compress(names)) == names


def test_help_shows_no_range_without_bounds():
    result = CliRunner().invoke(cli, ["submit", "--help"])
    assert result.exit_code == 0 and "None" not in result.output


# ---- inputs once accepted silently (issue 40): each is refused, saying where and what to write --------
@pytest.mark.parametrize(("name", "says"), [
    ("SLURM_NODELIST", "is Slurm's: it sets SLURM_* for the job and each step"),
    ("SLURMD_NODENAME", "ask Slurm through job.sbatch_options"),
    ("RANK", "is set for each rank by the launcher from the rank map"),
    ("LOCAL_RANK", "never reaches the program: remove it"),
    ("WORLD_SIZE", "never reaches the program"),
    ("MASTER_ADDR", "never reaches the program"),
    ("MASTER_PORT", "to choose the rendezvous port, set launch.master_port"),
    ("TORCHELASTIC_RUN_ID", "(by torchrun in its style)"),
    ("LD_PRELOAD", "start it through env: command = ['env', 'LD_PRELOAD=/path/lib.so', 'python3', 'train.py']"),
    ("CLUSTERCTL_REPORT_KEY", "is set by clusterctl's agent for each step"),
    ("CLUSTERCTL_NODE_DIR", "is set by clusterctl's agent for each step"),
    ("CLUSTERCTL_JOB_DIR", "is set by clusterctl's agent for each step"),
    ("CLUSTERCTL_CHECKPOINT", "is set by clusterctl's agent for each step"),
    ("CLUSTERCTL_CHECKPOINT_DIR", "is set by clusterctl from checkpoint.dir: set that key instead"),
    ("CLUSTERCTL_TP", "is set by clusterctl from [parallel]: set the size there instead"),
    ("CLUSTERCTL_RESUME_FROM", "set by clusterctl on every resume: remove it (to start from a checkpoint of your "
                               "choosing: clusterctl submit --resume PATH)"),
])
def test_launch_env_setting_what_slurm_or_the_launcher_sets_is_refused_naming_the_variable(name, says):
    message = _error(SPEC + f'[launch.env]\nNCCL_DEBUG = "INFO"\n{name} = "x"\n')
    assert message.startswith(f"job.toml:9, key `launch.env.{name}`: {name} ") and says in message
    inline = _error(SPEC.replace('command = ', f'env = {{ {name} = "x" }}\ncommand = '))
    assert inline.startswith(f"job.toml:6, key `launch.env.{name}`: {name} ")


def test_a_variable_the_launcher_owns_given_with_minus_e_names_the_option(tmp_path, monkeypatch, capsys):
    code, err = run_main(monkeypatch, capsys, "submit", str(write_spec(tmp_path, SPEC)), "--dry-run",
                         "--run-dir", str(tmp_path / "r"), "-e", "NCCL_DEBUG=INFO", "-e", "WORLD_SIZE=64")
    assert code == 7 and err.startswith("clusterctl: error: command line, key `-e/--env`: WORLD_SIZE is set for "
                                        "each rank by the launcher") and err.count("\n") == 1
    assert not (tmp_path / "r").exists()


def test_the_resume_variable_refused_is_the_one_the_spec_names():
    renamed = SPEC + '[checkpoint]\nresume_env = "RESUME_FROM"\n[launch.env]\n'
    assert "key `launch.env.RESUME_FROM`: RESUME_FROM carries the checkpoint a resume starts from" in \
        _error(renamed + 'RESUME_FROM = "/ckpt"\n')
    spec = parse_spec(renamed + 'CLUSTERCTL_RESUME_FROM = "x"\n', "job.toml", base_dir=Path("/base"))
    assert dict(spec.launch.env) == {"CLUSTERCTL_RESUME_FROM": "x"}  # not the variable this job resumes through


def test_launch_env_keeps_what_is_the_users_to_set():
    mine = {"NCCL_DEBUG": "INFO", "PATH": "/venv/bin:/usr/bin", "LD_LIBRARY_PATH": "/opt/lib", "PYTHONPATH": "/src",
            "CUDA_DEVICE_MAX_CONNECTIONS": "1", "CLUSTERCTL_NODE_TMP": "/local", "CLUSTERCTL_PROGRESS_INTERVAL": "5",
            "MY_RANK_OFFSET": "3", "SLURMISH": "y", "SLURM_CPU_BIND": "cores", "SLURM_MPI_TYPE": "pmix"}
    text = SPEC + "[launch.env]\n" + "".join(f'{k} = "{v}"\n' for k, v in mine.items())
    assert dict(parse_spec(text, "job.toml", base_dir=Path("/base")).launch.env) == mine


@settings(max_examples=300, deadline=None)
@given(name=st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
       | st.builds(str.__add__, st.sampled_from(["SLURM_", "SLURMD_", "TORCHELASTIC_", "CLUSTERCTL_", "LD_", "RANK"]),
                   st.from_regex(r"[A-Z0-9_]{0,8}", fullmatch=True))
       | st.sampled_from(["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
                          "MASTER_ADDR", "MASTER_PORT", "ROLE_RANK", "GROUP_WORLD_SIZE", "LD_PRELOAD",
                          "CLUSTERCTL_PEER_PORT", "CLUSTERCTL_EP", "CLUSTERCTL_RESUME_FROM"]))
def test_any_variable_name_is_kept_as_written_or_refused_naming_it(name):
    text = SPEC + f'[launch.env]\n{name} = "1"\n'
    try:
        spec = parse_spec(text, "job.toml", base_dir=Path("/base"))
    except SpecError as exc:
        message = str(exc)
        assert message.startswith(f"job.toml:8, key `launch.env.{name}`: {name} ")
        assert any(fix in message for fix in (": remove it", "instead", "start it through env", "job.sbatch_options"))
        assert name not in SRUN_INPUT_VARIABLES, "srun's own input variables are the user's to tune"
        assert name.startswith(("SLURM_", "SLURMD_", "TORCHELASTIC_", "CLUSTERCTL_")) or name in (
            "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR",
            "MASTER_PORT", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "LD_PRELOAD")
        return
    assert dict(spec.launch.env) == {name: "1"}


@pytest.mark.parametrize("python", ["venv/bin/python", "./python3", "python3", "~/venv/bin/python"])
def test_a_launch_python_that_is_not_an_absolute_path_is_refused_with_the_fix(python):
    message = _error(SPEC.replace('command = ', f'python = "{python}"\ncommand = '))
    assert message.startswith("job.toml:6, key `launch.python`: expected an absolute path to a Python with "
                              "clusterctl installed, as the compute nodes see it, like '/shared/venv/bin/python'")
    assert message.endswith(f"found a string {python!r}")


@pytest.mark.parametrize(("pattern", "says"), [
    (r"step \\d+", "expected a regular expression with a group around the step number, like 'step (\\d+)' or "
                   "'it=(?P<step>\\d+)'"),
    (r"step (?:\\d+)", "with a group around the step number"),  # a group that captures nothing
    (r"step (\\d+", "expected a regular expression (missing ), unterminated subpattern"),
    ("(" * 2000 + ")" * 2000, "expected a regular expression (maximum recursion depth exceeded"),
    (r"a{99999999999}", "expected a regular expression (the repetition number is too large)"),
])
def test_a_progress_pattern_without_a_group_for_the_step_is_refused_at_parse(pattern, says):
    message = _error(SPEC + f'[restart]\nprogress_pattern = "{pattern}"\n')
    assert message.startswith("job.toml:8, key `restart.progress_pattern`: ") and says in message


@settings(max_examples=200, deadline=None)
@given(text=st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=20),
       named=st.booleans())
def test_any_progress_pattern_is_refused_without_a_group_and_read_with_one(text, named):
    from clusterctl.launcher.pure.hang_watch import progress_from_log_line

    def toml(s: str) -> str:
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'

    plain = re.escape(text)  # no group at all
    assert "with a group around the step number" in _error(SPEC + f"[restart]\nprogress_pattern = {toml(plain)}\n")
    grouped = plain + (r"(?P<step>\d+)" if named else r"(\d+)")
    spec = parse_spec(SPEC + f"[restart]\nprogress_pattern = {toml(grouped)}\n", "job.toml", base_dir=Path("/b"))
    assert progress_from_log_line(f"{text}42", spec.restart.progress_pattern) == 42


@pytest.mark.parametrize("key", ["[job]\nruns_dir", "[launch]\nworkdir", "[placement]\ntopology", "[checkpoint]\ndir"])
def test_a_path_that_looks_like_an_option_is_refused(key):
    section, name = key.split("\n")
    text = SPEC.replace(f"{section}\n", f'{section}\n{name} = "--scratch"\n') if section in SPEC else \
        SPEC + f'{section}\n{name} = "--scratch"\n'
    message = _error(text)
    assert f"key `{section.strip('[]')}.{name}`: expected a path, not an option (write './--scratch' for one " \
           "really named so), found a string '--scratch'" in message
    assert parse_spec(text.replace('"--scratch"', '"./--scratch"'), "job.toml", base_dir=Path("/base"))


def test_a_workdir_that_does_not_exist_is_refused_by_submit_and_its_dry_run(tmp_path, monkeypatch, capsys):
    asked: list[list[str]] = []
    monkeypatch.setattr("clusterctl.launcher.login.cli.Slurm",
                        lambda: Slurm(lambda argv, timeout: asked.append(list(argv)) or Completed(1, "", "no Slurm")))
    spec = write_spec(tmp_path, SPEC.replace('command = ', 'workdir = "missing/dir"\ncommand = '))
    for dry_run in (["--dry-run"], []):
        code, err = run_main(monkeypatch, capsys, "submit", str(spec), *dry_run, "--run-dir", str(tmp_path / "r"))
        assert asked == [] and code == 7 and err == (f"clusterctl: error: {spec}, key `launch.workdir`: the directory the job runs "
                                     f"in, {tmp_path / 'missing' / 'dir'}, does not exist; create it, or fix "
                                     "launch.workdir (a relative one is from the spec file's folder)\n")
        assert not (tmp_path / "r").exists()
    (tmp_path / "missing").write_text("")
    code, err = run_main(monkeypatch, capsys, "submit", str(spec), "--dry-run", "--run-dir", str(tmp_path / "r"))
    assert code == 7 and "cannot be reached (Not a directory)" in err
    (tmp_path / "missing").unlink()
    (tmp_path / "missing").mkdir()
    (tmp_path / "missing" / "dir").write_text("")
    code, err = run_main(monkeypatch, capsys, "submit", str(spec), "--dry-run", "--run-dir", str(tmp_path / "r"))
    assert code == 7 and f"{tmp_path / 'missing' / 'dir'} is not a directory; launch.workdir is the directory" in err
