"""The rendered sbatch script and argv: exact (golden), valid bash, shellcheck-clean, inert."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterctl.errors import SpecError
from clusterctl.launcher.pure.render import SlurmFacts, Template, compact_request, prepare, render_script
from clusterctl.launcher.pure.shell import quote
from clusterctl.launcher.pure.spec import load_spec, parse_spec
from clusterctl.launcher.login.submit import load_template
from clusterctl.slurm.topology import parse_scontrol_topology
from clusterctl.slurm.version import SlurmVersion
from tests.conftest import REPO
from tests.golden import assert_golden

DATA = REPO / "tests" / "data"
TOPOLOGY = parse_scontrol_topology((DATA / "slurm" / "scontrol-show-topology.txt").read_text())
OLD, MID, NEW = SlurmVersion(22, 5, 8), SlurmVersion(24, 11, 5), SlurmVersion(26, 5, 5)
FACTS = SlurmFacts(OLD, None, TOPOLOGY)
BLOCKS = parse_scontrol_topology("BlockName=b1 BlockIndex=0 Nodes=node[1-4] BlockSize=4\n"
                                 "BlockName=b2 BlockIndex=1 Nodes=node[5-8] BlockSize=4\n"
                                 "AggregatedBlock=b[1-2] BlockIndex=2 Nodes=node[1-8] BlockSize=8\n")
PYTHON = "/opt/clusterctl/bin/python3"

TORCHRUN = """\
[job]
name = "llama-70b"
nodes = 4
partition = "gpu"
account = "ml-research"
time = "2-00:00:00"
spare_nodes = 1
exclude = "node9"
sbatch_options = ["--mem=0", "--exclusive"]

[launch]
style = "torchrun"
command = ["python3", "-m", "megatron.train", "--tensor-model-parallel-size", "{tp}",
           "--pipeline-model-parallel-size", "{pp}", "--save", "{checkpoint_dir}"]
env = { NCCL_DEBUG = "WARN", HF_HOME = "/scratch/hf" }
tp_comm_overlap = true

[parallel]
tp = 8
pp = 2

[placement]
switches = 2
switch_wait = "10:00"

[checkpoint]
dir = "/ckpt/llama"
resume_args = ["--load", "{path}"]
"""


def _requests():
    example = load_spec(REPO / "examples" / "toy_trainer.toml")
    torchrun = parse_spec(TORCHRUN, "llama.toml", base_dir=Path("/work/llama"))
    spares = parse_spec((REPO / "examples" / "toy_trainer.toml").read_text().replace(
        "gpus_per_node = 8", "gpus_per_node = 8\nspare_nodes = 1"), "toy-spares.toml", base_dir=REPO / "examples")
    return {
        "srun-example": prepare(example, load_template(example), FACTS, run_dir="/runs/toy-1", python=PYTHON),
        "torchrun-resume": prepare(torchrun, load_template(torchrun), FACTS, run_dir="/runs/llama-3", python=PYTHON,
                                   attempt=3, resume_from="/ckpt/llama/iter_0000200", exclude="node[2,4]",
                                   no_requeue=True),
        "srun-spares-resume": prepare(spares, load_template(spares), FACTS, run_dir="/runs/toy-2", python=PYTHON,
                                      attempt=2, resume_from="/runs/toy-2/checkpoints/step-00000020",
                                      no_requeue=True),
    }


@pytest.mark.parametrize("name", ["srun-example", "torchrun-resume", "srun-spares-resume"])
def test_rendered_script_and_argv_match_golden(name):
    request = _requests()[name]
    # The example's workdir is this checkout; goldens must not depend on where it lives.
    argv = [a.replace(str(REPO), "<repo>") for a in request.sbatch_argv]
    assert_golden(f"submit/{name}.sbatch", request.script.replace(str(REPO), "<repo>"))
    assert_golden(f"submit/{name}.argv.json", json.dumps(argv, indent=2) + "\n")


def test_resume_reaches_the_program_as_arguments_and_environment():
    request = _requests()["torchrun-resume"]
    assert "export CLUSTERCTL_RESUME_FROM=/ckpt/llama/iter_0000200" in request.script
    assert "--resume-from /ckpt/llama/iter_0000200" in request.script  # the agent's, which builds the command
    assert request.command[-2:] == ("--load", "/ckpt/llama/iter_0000200")
    assert "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 2" in " ".join(request.command)
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in request.script
    assert "--exclude=node9,node[2,4]" in request.sbatch_argv and "--no-requeue" in request.sbatch_argv
    assert "--switches=2@10:00" in request.sbatch_argv and request.sbatch_argv[-1] == request.script_path


HOSTILE = ["$(touch /tmp/pwned)", "`touch /tmp/pwned`", "'; touch /tmp/pwned; '", '"$HOME"', "a\nb; rm -rf /",
           "*", "~root", "${IFS}", "!!", "x\\", "a b\tc", "-n", "$((1+1))", "\u00e9\u4e2d\u2603"]


def _hostile_spec(tmp_path: Path):
    env = "\n".join(f"V{i} = {json.dumps(v)}" for i, v in enumerate(HOSTILE))
    text = (f'[job]\nname = "x; touch /tmp/pwned"\nnodes = 1\ngpus_per_node = 1\n[launch]\n'
            f'command = {json.dumps(["printf", "%s|", *HOSTILE])}\n[launch.env]\n{env}\n')
    return parse_spec(text, "hostile.toml", base_dir=tmp_path)


@pytest.mark.skipif(not shutil.which("shellcheck"), reason="shellcheck is installed by scripts/setup.sh")
def test_every_rendered_script_passes_bash_n_and_shellcheck(tmp_path):
    scripts = {name: r.script for name, r in _requests().items()}
    hostile = _hostile_spec(tmp_path)
    scripts["hostile"] = prepare(hostile, load_template(hostile), FACTS, run_dir="/runs/$(touch x)/`y`",
                                 python=PYTHON, resume_from="/ck/'$(z)'").script
    for name, script in scripts.items():
        path = tmp_path / f"{name}.sbatch"
        path.write_text(script)
        assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0, name
        checked = subprocess.run(["shellcheck", "-s", "bash", str(path)], capture_output=True, text=True)
        assert checked.returncode == 0, f"{name}:\n{checked.stdout}"


def test_hostile_values_come_out_of_the_script_as_literal_text(tmp_path):
    spec = _hostile_spec(tmp_path)
    script = render_script(spec, Template("{{environment}}\ncommand=({{command}})\n"
                                          'for v in V0 V1 V2 V3 V4; do printf "%s|" "${!v}"; done\n'
                                          '"${command[@]}"\n', "probe"), run_dir="/r", python=PYTHON)
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "|".join(HOSTILE[:5]) + "|" + "|".join(HOSTILE) + "|"
    assert list(tmp_path.iterdir()) == [] and not Path("/tmp/pwned").exists()


@settings(max_examples=80, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40))
def test_quote_makes_any_text_one_inert_bash_word(text):
    done = subprocess.run(["bash", "-c", f"printf %s {quote(text)}"], capture_output=True)
    assert done.stdout == text.encode("utf-8", "surrogateescape")


def test_a_custom_template_with_an_unknown_placeholder_names_its_line():
    spec = load_spec(REPO / "examples" / "toy_trainer.toml")
    with pytest.raises(SpecError, match=r"my.sbatch:2: unknown placeholder \{\{nodelist\}\}; known: \{\{header\}\}"):
        render_script(spec, Template("#!/bin/bash\nsrun -w {{nodelist}}\n", "my.sbatch"), run_dir="/r", python="p")


@pytest.mark.parametrize(("facts", "switches", "expected", "warned"), [
    (FACTS, "auto", ["--switches=2@5:00"], False),          # 3 nodes need both 2-node leaves
    (FACTS, 1, ["--switches=1@5:00"], False),
    (FACTS, 0, [], False),
    (SlurmFacts(OLD, None, None), "auto", [], True),  # no tree topology: say so, ask nothing
    (SlurmFacts(OLD, "topology/block", None), "auto", [], True),
    (SlurmFacts(SlurmVersion(23, 11, 1), "topology/block", BLOCKS), "auto", [], True),  # no --segment before 24.05
    (SlurmFacts(MID, "topology/block", BLOCKS), "auto", ["--segment=3"], False),  # 3 nodes fit one 4-node block
    (SlurmFacts(MID, "topology/block", None), "auto", [], True),  # block size unknown: never guess
    (SlurmFacts(NEW, "topology/flat", BLOCKS), "auto", ["--segment=3"], False),  # topology.yaml: plugin reads flat
    (SlurmFacts(NEW, "topology/flat", TOPOLOGY), "auto", ["--switches=2@5:00"], False),
    (SlurmFacts(MID, "topology/flat", TOPOLOGY), "auto", [], True),
])
def test_compact_request_follows_the_topology_plugin_and_version(facts, switches, expected, warned):
    spec = load_spec(REPO / "examples" / "toy_trainer.toml")
    from dataclasses import replace
    spec = replace(spec, placement=replace(spec.placement, switches=switches))
    options, warnings = compact_request(spec, facts)
    assert options == expected and bool(warnings) == warned


@pytest.mark.parametrize(("nodes", "segment"), [(1, 1), (4, 4), (6, 3), (8, 4), (12, 4), (10, 2), (7, None)])
def test_a_segment_divides_the_job_and_fits_one_block(nodes, segment):
    spec = load_spec(REPO / "examples" / "toy_trainer.toml")
    from dataclasses import replace
    spec = replace(spec, job=replace(spec.job, nodes=nodes, spare_nodes=0))
    options, warnings = compact_request(spec, SlurmFacts(MID, "topology/block", BLOCKS))
    assert options == ([f"--segment={segment}"] if segment else [])
    assert bool(warnings) == (segment is None)


def test_a_resubmission_without_failed_nodes_asks_for_the_leaves_that_remain():
    spec = load_spec(REPO / "examples" / "toy_trainer.toml")
    from dataclasses import replace
    spec = replace(spec, job=replace(spec.job, nodes=2, spare_nodes=0))
    assert compact_request(spec, FACTS)[0] == ["--switches=1@5:00"]  # node[1-2] or node[3-4]: one leaf
    # node2 and node3 failed: node1 and node4 are on two leaves; one would wait switch_wait for nothing.
    assert compact_request(spec, FACTS, {"node2", "node3"})[0] == ["--switches=2@5:00"]
    argv, _ = prepare(spec, load_template(spec), FACTS, run_dir="/r", python=PYTHON, exclude="node[2-3]").sbatch_argv, 0
    assert "--switches=2@5:00" in argv and "--exclude=node[2-3]" in argv


def test_torchrun_with_spares_keeps_its_allocation_when_a_node_fails_and_its_script_runs_the_agent():
    torchrun = parse_spec(TORCHRUN, "llama.toml", base_dir=Path("/work/llama"))
    request = prepare(torchrun, load_template(torchrun), FACTS, run_dir="/r", python=PYTHON)
    assert request.warnings == () and "--no-kill" in request.sbatch_argv
    assert "--ntasks-per-node=1" in request.sbatch_argv
    assert "exec \"$python\" -m clusterctl.launcher.job agent" in request.script


def test_spares_with_a_template_of_your_own_say_it_must_run_the_agent(tmp_path):
    template = tmp_path / "mine.sbatch"
    template.write_text("#!/bin/bash\n{{header}}\nsrun {{command}}\n")
    spec = parse_spec(TORCHRUN.replace('style = "torchrun"', f'style = "torchrun"\ntemplate = "{template}"'),
                      "llama.toml", base_dir=tmp_path)
    request = prepare(spec, load_template(spec), FACTS, run_dir="/r", python=PYTHON)
    assert "--no-kill" in request.sbatch_argv
    assert [w for w in request.warnings if "must run `python -m clusterctl.launcher.job agent`" in w]


def test_cuda_device_max_connections_only_when_the_spec_asks_for_megatron_tp_overlap():
    """FSDP and torchtitan jobs with tp > 1 and the default order run without it (one connection would
    serialise their overlap); a Megatron spec that says tp_comm_overlap gets it; its own env value wins."""
    fsdp = TORCHRUN.replace("tp_comm_overlap = true\n", "")
    for text, expected in ((fsdp, None), (fsdp.replace("[parallel]", "[parallel]\norder = 'torchtitan'"), None),
                           (TORCHRUN, "export CUDA_DEVICE_MAX_CONNECTIONS=1"),
                           (TORCHRUN.replace("tp = 8", "tp = 1"), None),
                           (TORCHRUN.replace('NCCL_DEBUG = "WARN"', 'CUDA_DEVICE_MAX_CONNECTIONS = "8"'),
                            "export CUDA_DEVICE_MAX_CONNECTIONS=8")):
        spec = parse_spec(text, "llama.toml", base_dir=Path("/work/llama"))
        script = prepare(spec, load_template(spec), FACTS, run_dir="/runs/r", python=PYTHON).script
        exported = [line for line in script.splitlines() if "CUDA_DEVICE_MAX_CONNECTIONS" in line]
        assert exported == ([expected] if expected else []), (text, exported)
