"""The job spec: what an engineer writes, what clusterctl understands, and how it says no."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterctl.errors import SpecError
from clusterctl.launcher.pure.spec import (
    FIELDS, CheckpointSection, JobSection, LaunchSection, PlacementSection, RestartSection, fill_data_parallel,
    load_spec, owned_variable, parse_overrides, parse_spec, reference_rows, spec_from_dict,
)
from clusterctl.launcher.pure.straggler_watch import StragglerPolicy
from tests.conftest import REPO

MINIMAL = """\
[job]
name = "llm"
nodes = 2

[launch]
command = ["python3", "train.py"]
"""


def _error(text: str, **kwargs) -> str:
    with pytest.raises(SpecError) as caught:
        parse_spec(text, "job.toml", base_dir=Path("/base"), **kwargs)
    return str(caught.value)


def test_the_example_spec_reads_as_written():
    spec = load_spec(REPO / "examples" / "toy_trainer.toml")
    assert (spec.job.name, spec.job.nodes, spec.job.gpus_per_node) == ("toy-trainer", 3, 8)
    assert (spec.parallel.tp, spec.parallel.pp, spec.parallel.dp) == (8, 3, 1)
    assert spec.launch.workdir == str(REPO / "examples")
    assert spec.checkpoint_dir("/runs/r1") == "/runs/r1/checkpoints"


def test_defaults_fill_what_is_not_written():
    spec = parse_spec(MINIMAL, "job.toml", base_dir=Path("/base"))
    assert spec.job.gpus_per_node == 8 and spec.launch.style == "srun" and spec.launch.workdir == "/base"
    assert spec.parallel.dp == 16 and spec.placement.switches == "auto" and spec.restart.max_restarts == 10


def test_an_unknown_key_names_file_line_and_a_likely_fix():
    message = _error(MINIMAL.replace('nodes = 2', 'nodes = 2\ngpu_per_node = 4'))
    assert message.startswith("job.toml:4, key `job.gpu_per_node`: unknown key `gpu_per_node` in [job]")
    assert "did you mean `gpus_per_node`?" in message


def test_swapping_stragglers_without_spares_says_what_to_set_instead():
    message = _error(MINIMAL + '[stragglers]\naction = "swap"\n')
    assert message.startswith("job.toml:8, key `stragglers.action`: `swap` needs spare nodes to swap in: set "
                              "job.spare_nodes, or use `exclude`")
    spec = parse_spec(MINIMAL.replace("nodes = 2", "nodes = 2\nspare_nodes = 1") + '[stragglers]\naction = "swap"\n'
                      'margin = 1.5\n', "job.toml", base_dir=Path("/base"))
    assert (spec.stragglers.action, spec.stragglers.margin, spec.stragglers.window_steps) == ("swap", 1.5, 30)
    assert "at least 1.01" in _error(MINIMAL + "[stragglers]\nmargin = 1.0\n")


def test_a_run_directory_written_before_stragglers_existed_reads_with_the_defaults():
    import json

    spec = parse_spec(MINIMAL, "job.toml", base_dir=Path("/base"))
    old = {k: v for k, v in json.loads(json.dumps(spec.to_dict())).items() if k != "stragglers"}
    assert spec_from_dict(old).stragglers == StragglerPolicy()


def test_an_unknown_section_is_an_error():
    assert "unknown section [lauch]; did you mean `launch`?" in _error(MINIMAL + "[lauch]\nstyle = 'srun'\n")


@pytest.mark.parametrize(("change", "expected"), [
    (('nodes = 2', 'nodes = "two"'), "job.toml:3, key `job.nodes`: expected a whole number, found a string 'two'"),
    (('nodes = 2', 'nodes = 0'), "key `job.nodes`: expected a whole number of at least 1, found a whole number 0"),
    (('nodes = 2', 'nodes = 2\ntime = "2 hours"'), "key `job.time`: expected a Slurm time like 90, 1:30:00"),
    (('command = ["python3", "train.py"]', 'command = "python3 train.py"'),
     "key `launch.command`: expected a list of strings, found a string"),
    (('command = ["python3", "train.py"]', 'command = []'), "expected a non-empty list of strings"),
    (('command = ["python3", "train.py"]', 'command = ["a"]\nstyle = "srunn"'),
     "expected one of srun, torchrun, found 'srunn'; did you mean `srun`?"),
    (('command = ["python3", "train.py"]', 'command = ["a"]\nenv = {"1BAD" = "x"}'),
     "`1BAD` is not a valid environment variable name"),
    (('nodes = 2', 'nodes = 2\nexclude = "node[1-"'), "key `job.exclude`: expected a Slurm hostlist"),
    (('nodes = 2', 'nodes = 2\nsbatch_options = ["--nodes=4"]'), "--nodes is set by clusterctl from other keys"),
    (('nodes = 2', 'nodes = 2\nname = "a\\nb"'), "found a string"),
    (('nodes = 2', 'nodes = 2\ngpu_peak_tflops = 0'),
     "job.toml:4, key `job.gpu_peak_tflops`: expected a number of at least 0.001, found a whole number 0"),
    (('nodes = 2', 'nodes = 2\ngpu_peak_tflops = "989"'),
     "job.toml:4, key `job.gpu_peak_tflops`: expected a number, found a string '989'"),
    (('nodes = 2', 'nodes = 2\ngpu_peak_tflops = nan'), "key `job.gpu_peak_tflops`: expected a finite number"),
])
def test_wrong_values_say_where_what_was_expected_and_what_was_found(change, expected):
    old, new = change
    text = MINIMAL.replace('name = "llm"\n', "") if "name =" in new else MINIMAL
    assert expected in _error(text.replace(old, new))


def test_the_gpus_peak_for_mfu_is_taken_from_the_spec_when_given_else_left_to_the_gpu_model():
    assert parse_spec(MINIMAL, "job.toml", base_dir=Path("/base")).job.gpu_peak_tflops is None
    spec = parse_spec(MINIMAL.replace("nodes = 2", "nodes = 2\ngpu_peak_tflops = 989"), "job.toml", base_dir=Path("/b"))
    assert spec.job.gpu_peak_tflops == 989.0 and spec_from_dict(spec.to_dict()) == spec


def test_a_missing_required_key_says_what_it_is_for():
    message = _error(MINIMAL.replace('nodes = 2\n', ''))
    assert message.startswith("job.toml, key `job.nodes`: missing; Nodes the training runs on.")


def test_a_layout_that_does_not_fill_the_gpus_says_which_numbers_to_change():
    message = _error(MINIMAL + "[parallel]\ntp = 8\npp = 4\ndp = 2\n")
    assert "the layout needs 64 GPUs" in message and "job has 16 (2 nodes × 8)" in message


def test_a_layout_that_leaves_no_whole_dp_says_so():
    assert "tp×cp×pp = 3 does not divide the job's 16 GPUs" in _error(MINIMAL + "[parallel]\npp = 3\n")


def test_not_toml_is_a_one_line_error():
    assert _error("[job\nname = 1").startswith("job.toml: not valid TOML")


def test_overrides_win_over_the_file():
    overrides = parse_overrides(nodes=4, time="1:00:00", env=["NCCL_DEBUG=INFO"])
    spec = parse_spec(MINIMAL, "job.toml", overrides, base_dir=Path("/base"))
    assert spec.job.nodes == 4 and spec.job.time == "1:00:00" and spec.parallel.dp == 32
    assert dict(spec.launch.env) == {"NCCL_DEBUG": "INFO"}


def test_overrides_are_checked_like_the_file_and_name_the_option():
    with pytest.raises(SpecError, match="command line, key `--time`: expected a Slurm time"):
        parse_overrides(time="soon")
    with pytest.raises(SpecError, match="command line, key `-e/--env`: expected NAME=VALUE"):
        parse_overrides(env=["NOEQUALS"])


def test_dp_fills_the_gpus_left_by_tp_cp_and_pp():
    assert fill_data_parallel({"tp": 8, "pp": 2}, 64) == (16, 4)
    assert fill_data_parallel({"tp": 8, "pp": 3}, 64) == (24, None)


def test_the_reference_documents_every_field_the_parser_reads():
    sections = {"job": JobSection, "launch": LaunchSection, "placement": PlacementSection,
                "checkpoint": CheckpointSection, "restart": RestartSection, "stragglers": StragglerPolicy}
    documented = {f.dotted for f in FIELDS}
    for name, cls in sections.items():
        for item in dataclasses.fields(cls):
            assert f"{name}.{item.name}" in documented, f"{name}.{item.name} has no reference entry"
    assert [row[0] for row in reference_rows()] == [f.dotted for f in FIELDS]
    assert all(row[3] for row in reference_rows())


names = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FFF, blacklist_categories=("Cs",)),
                min_size=1, max_size=30).filter(lambda s: s.isprintable())
values = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=30)


@settings(max_examples=60, deadline=None)
@given(name=names, nodes=st.integers(1, 64), gpn=st.sampled_from([1, 2, 4, 8]),
       env=st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True).filter(lambda n: not owned_variable(n)),
                           values, max_size=3),
       argv=st.lists(values.filter(lambda v: "{" not in v), min_size=1, max_size=4))  # {x}: a placeholder
def test_any_valid_spec_survives_the_run_directory_round_trip(name, nodes, gpn, env, argv):
    import json

    def toml(s: str) -> str:
        return '"' + "".join(c if c.isprintable() and c not in '"\\' else f"\\U{ord(c):08X}" for c in s) + '"'

    text = (f"[job]\nname = {toml(name)}\nnodes = {nodes}\ngpus_per_node = {gpn}\n"
            f"[launch]\ncommand = [{', '.join(toml(a) for a in argv)}]\n"
            "[launch.env]\n" + "".join(f"{k} = {toml(v)}\n" for k, v in env.items()))
    spec = parse_spec(text, "job.toml", base_dir=Path("/base"))
    assert spec.job.name == name and list(spec.launch.command) == argv and dict(spec.launch.env) == env
    assert spec_from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_multi_level_checkpoints_are_off_unless_asked_and_say_what_they_need():
    assert parse_spec(MINIMAL, "job.toml", base_dir=Path("/base")).checkpoint.tiers is False
    tiers = MINIMAL + '[checkpoint]\ndir = "{run_dir}/ckpt"\ntiers = true\nflush_every_steps = 300\n'
    spec = parse_spec(tiers, "job.toml", base_dir=Path("/base"))
    assert (spec.checkpoint.tiers, spec.checkpoint.keep, spec.checkpoint.flush_every_steps) == (True, 2, 300)
    assert "key `checkpoint.tiers`: expected true or false, found a string 'yes'" in \
        _error(tiers.replace("tiers = true", 'tiers = "yes"'))
    assert "needs [checkpoint] dir" in _error(MINIMAL + "[checkpoint]\ntiers = true\n")
    assert "'scratch' is not an absolute path" in _error(tiers + 'local_dir = "scratch"\n')
    assert "needs the built-in templates" in _error(tiers.replace("[launch]\n", '[launch]\ntemplate = "my.sbatch"\n'))
    assert "`checkpoint.keep`: expected a whole number of at least 1" in _error(tiers + "keep = 0\n")
    # which checkpoints the supervisor and `clusterctl report` take as complete
    assert spec.checkpoint.recognised_by == "tiers"
    assert parse_spec(MINIMAL, "job.toml", base_dir=Path("/base")).checkpoint.recognised_by == "auto"
