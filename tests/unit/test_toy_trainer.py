"""The example trainer's checkpoint protocol and determinism (in-process, world size 1 and 3)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import import_testbed

TRAINER = Path(__file__).resolve().parents[2] / "examples" / "toy_trainer.py"
spec = importlib.util.spec_from_file_location("toy_trainer", TRAINER)
toy = importlib.util.module_from_spec(spec)
spec.loader.exec_module(toy)


@pytest.fixture(autouse=True)
def single_rank(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", toy.RESUME_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/nonexistent")  # no NVML here: GPU checks off


def run(ckpt: Path, steps: int, *extra: str) -> int:
    return toy.main(["--checkpoint-dir", str(ckpt), "--steps", str(steps), "--step-time", "0",
                     "--checkpoint-every", "5", "--log-every", "1000", *extra])


def final(ckpt: Path) -> dict:
    return json.loads((ckpt / "final.json").read_text())


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stop=st.integers(min_value=1, max_value=29))
def test_interrupted_and_resumed_equals_uninterrupted(tmp_path_factory, stop):
    whole, split = tmp_path_factory.mktemp("whole"), tmp_path_factory.mktemp("split")
    assert run(whole, 30) == 0
    assert run(split, stop) == 0
    assert run(split, 30) == 0  # resumes from the newest complete checkpoint (or starts fresh)
    assert final(split) == final(whole)


def test_a_written_checkpoint_is_complete(tmp_path):
    state = toy.initial_state(7)
    state["step"] = 5
    path = toy.write_checkpoint(tmp_path, state)
    assert sorted(p.name for p in path.iterdir()) == ["manifest.json", "params.json"]
    assert not list(tmp_path.glob(".tmp-*"))
    assert toy.load_checkpoint(path)["params"] == state["params"]


def test_a_checkpoint_cut_short_before_its_rename_is_never_seen(tmp_path, monkeypatch):
    state = toy.initial_state(7)
    state["step"] = 5

    def crash(src, dst):
        raise OSError("the node died here")
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="the node died here"):
        toy.write_checkpoint(tmp_path, state)
    monkeypatch.undo()
    assert not list(tmp_path.glob("step-*")) and toy.latest_checkpoint(tmp_path) is None


def test_half_written_and_corrupt_checkpoints_are_skipped(tmp_path, capsys):
    good = toy.initial_state(1)
    good["step"] = 10
    toy.write_checkpoint(tmp_path, good)
    corrupt = dict(good, step=20)
    (toy.write_checkpoint(tmp_path, corrupt) / "params.json").write_text('{"params": [1, 2, 3]}')
    half = tmp_path / "step-00000030"
    half.mkdir()
    (half / "params.json").write_text("{}")  # crashed before the manifest was written
    assert toy.latest_checkpoint(tmp_path) == tmp_path / "step-00000010"
    out = capsys.readouterr().out
    assert "step-00000030: no manifest.json (checkpoint incomplete)" in out
    assert "step-00000020: params.json does not match the manifest's checksum" in out


def test_the_resume_variable_picks_the_checkpoint_to_start_from(tmp_path, monkeypatch, capsys):
    assert run(tmp_path, 10) == 0
    monkeypatch.setenv(toy.RESUME_ENV, str(tmp_path / "step-00000005"))
    capsys.readouterr()
    assert run(tmp_path, 12) == 0
    assert f"resumed from {tmp_path / 'step-00000005'}; world size 1; steps 5..12" in capsys.readouterr().out


def test_resume_none_starts_fresh_even_with_checkpoints_present(tmp_path, capsys):
    assert run(tmp_path / "a", 10) == 0
    capsys.readouterr()
    assert run(tmp_path / "a", 12, "--resume", "none") == 0
    assert "fresh start; world size 1; steps 0..12" in capsys.readouterr().out
    assert run(tmp_path / "b", 12) == 0
    assert final(tmp_path / "a") == final(tmp_path / "b")


def test_three_ranks_rendezvous_over_tcp_and_agree(tmp_path):
    env = {**os.environ, "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29731",
           "LD_LIBRARY_PATH": "/nonexistent"}
    procs = [subprocess.Popen([sys.executable, str(TRAINER), "--checkpoint-dir", str(tmp_path), "--steps", "20",
                               "--step-time", "0", "--peer-timeout", "20"], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, text=True) for r in range(3)]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert final(tmp_path)["world_size"] == 3


def test_a_dead_peer_makes_the_others_give_up_instead_of_hanging(tmp_path):
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29732",
           "LD_LIBRARY_PATH": "/nonexistent"}
    rank0 = subprocess.Popen([sys.executable, str(TRAINER), "--checkpoint-dir", str(tmp_path), "--steps", "1000",
                              "--step-time", "0.01", "--peer-timeout", "2"], env={**env, "RANK": "0"},
                             stdout=subprocess.PIPE, text=True)
    rank1 = subprocess.Popen([sys.executable, str(TRAINER), "--checkpoint-dir", str(tmp_path), "--steps", "1000",
                              "--step-time", "0.01", "--peer-timeout", "2"], env={**env, "RANK": "1"},
                             stdout=subprocess.PIPE, text=True)
    while not (tmp_path / "step-00000010").exists():
        assert rank0.poll() is None
    rank1.kill()
    out, _ = rank0.communicate(timeout=30)
    assert rank0.returncode == toy.EXIT_PEER_LOST
    assert "giving up: rank 1 closed the connection" in out


def test_missing_rank_variables_are_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("RANK")
    with pytest.raises(SystemExit, match="set RANK"):
        run(tmp_path, 1)


@pytest.fixture(scope="module")
def nvml_lib(tmp_path_factory) -> Path:
    """The testbed's emulated libnvidia-ml.so.1, which the trainer loads by soname like the real driver."""
    build_nvml = import_testbed("cluster").build_nvml

    lib = tmp_path_factory.mktemp("nvml") / "libnvidia-ml.so.1"
    build_nvml(lib)
    return lib


def throttled_node(tmp_path: Path, percent: int) -> Path:
    from clusterctl_testbed.gpu_faults import Fault, inject

    node = tmp_path / "node"
    node.mkdir()
    (node / "events").touch()
    inject(node, Fault("throttle", gpu=0, value=percent))
    return node


def on_emulated_gpu(lib: Path, node: Path, **extra: str) -> dict:
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LD_LIBRARY_PATH": str(lib.parent),
           "NVML_EMU_DIR": str(node), **extra}
    env.pop("NVML_EMU_ROOT", None)
    return env


def test_a_rank_on_a_throttled_gpu_computes_slower_and_reports_its_compute_time(tmp_path, nvml_lib):
    from clusterctl.records.rank_progress import rank_progress_path, read_rank_progress

    node = throttled_node(tmp_path, 25)  # a quarter of its clock: 4x slower
    env = on_emulated_gpu(nvml_lib, node, CLUSTERCTL_JOB_DIR=str(tmp_path / "job"), CLUSTERCTL_PROGRESS_INTERVAL="0")
    out = subprocess.run([sys.executable, str(TRAINER), "--checkpoint-dir", str(tmp_path / "ck"), "--steps", "5",
                          "--step-time", "0.02", "--log-every", "1000"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "GPU 0 clocks at 25% (SM 495/1980 MHz): steps compute 4.0x slower" in out.stdout
    report = read_rank_progress(rank_progress_path(tmp_path / "job", 0))
    assert report.compute_steps == 5 and 5 * 0.08 <= report.compute_s < 5 * 0.08 + 2.0


def test_a_throttle_changes_how_long_steps_take_but_not_what_the_run_computes(tmp_path, nvml_lib):
    assert run(tmp_path / "full-speed", 12) == 0
    out = subprocess.run([sys.executable, str(TRAINER), "--checkpoint-dir", str(tmp_path / "throttled"), "--steps",
                          "12", "--step-time", "0.001", "--checkpoint-every", "5", "--log-every", "1000"],
                         env=on_emulated_gpu(nvml_lib, throttled_node(tmp_path, 40)), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "GPU 0 clocks at 40% (SM 792/1980 MHz): steps compute 2.5x slower" in out.stdout
    assert final(tmp_path / "throttled") == final(tmp_path / "full-speed")


def test_a_throttle_lifted_mid_run_is_logged_once_as_back_to_full_speed(tmp_path, nvml_lib):
    from clusterctl_testbed.gpu_faults import Fault, inject

    node = throttled_node(tmp_path, 50)
    proc = subprocess.Popen([sys.executable, str(TRAINER), "--checkpoint-dir", str(tmp_path / "ck"), "--steps", "2000",
                             "--step-time", "0.005", "--checkpoint-every", "100000", "--log-every", "100000"],
                            env=on_emulated_gpu(nvml_lib, node), stdout=subprocess.PIPE, text=True)
    try:
        seen = []
        for line in proc.stdout:  # ends at the latest when the run does
            seen.append(line)
            if "GPU 0 clocks at 50% (SM 990/1980 MHz): steps compute 2.0x slower" in line:
                inject(node, Fault("throttle", gpu=0, value=100))
            if "GPU 0 clocks back to full speed" in line:
                break
        assert "GPU 0 clocks back to full speed" in seen[-1], seen
    finally:
        proc.terminate()
        rest = proc.communicate(timeout=30)[0]
    assert sum("clocks" in line for line in seen + rest.splitlines()) == 2


def test_without_clusterctl_a_rank_on_a_throttled_gpu_still_trains(tmp_path, nvml_lib):
    env = on_emulated_gpu(nvml_lib, throttled_node(tmp_path, 50), CLUSTERCTL_JOB_DIR=str(tmp_path / "job"))
    env.pop("PYTHONPATH", None)
    # -S: no site-packages, so clusterctl cannot be imported and its progress beats are not sent.
    out = subprocess.run([sys.executable, "-S", str(TRAINER), "--checkpoint-dir", str(tmp_path / "ck"), "--steps",
                          "3", "--step-time", "0"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "GPU 0 clocks at 50% (SM 990/1980 MHz): steps compute 2.0x slower" in out.stdout
    assert final(tmp_path / "ck")["step"] == 3 and not (tmp_path / "job").exists()


@pytest.mark.parametrize("bulk", [(), ("--state-mb", "1")], ids=["small-state", "bulk-state"])
def test_with_multi_level_checkpoints_on_each_rank_saves_to_its_node_and_a_resume_is_bit_identical(
        tmp_path, monkeypatch, capsys, bulk):
    import socket

    from clusterctl.records.checkpoint_settings import CheckpointSettings
    from clusterctl.records.tier_index import TierSlot, write_tier_index

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def tiered(run: str, resume_step: int | None) -> None:
        launch = tmp_path / run / "launch"
        launch.mkdir(parents=True, exist_ok=True)
        index = launch / "tiers.idx"
        write_tier_index(index, resume_step, [TierSlot("node1", "-", *(("shared", "node1", "-")
                                                                       if resume_step is not None else ("-",) * 3))])
        settings = CheckpointSettings(run_key="00000000000000aa", local_base=str(tmp_path / "node1-shm"),
                                      shared_dir=str(tmp_path / run / "shared"), tier_index=str(index), port=port,
                                      flush_every_steps=10, resume_step=resume_step)
        for name, value in {**settings.to_env(), "SLURMD_NODENAME": "node1", "LOCAL_RANK": "0",
                            "LOCAL_WORLD_SIZE": "1", "NODE_RANK": "0", "CLUSTERCTL_REPORT_KEY": "ab" * 32}.items():
            monkeypatch.setenv(name, value)

    tiered("whole", None)
    assert run(tmp_path / "whole" / "shared", 20, *bulk) == 0
    tiered("split", None)
    assert run(tmp_path / "split" / "shared", 12, *bulk) == 0  # saved steps 5 and 10 to node1's memory, 10 flushed
    assert "checkpoint step 10 saved to the node tier" in capsys.readouterr().out
    assert not list((tmp_path / "split" / "shared").glob("step-*"))  # nothing the classic way
    tiered("split", 10)
    assert run(tmp_path / "split" / "shared", 20, *bulk) == 0
    said = capsys.readouterr().out
    assert "resumed step 10 from shared storage" in said
    assert ("1 MB of this rank's bulk state with it" in said) == bool(bulk)
    assert final(tmp_path / "split" / "shared") == final(tmp_path / "whole" / "shared")


def test_bulk_state_goes_to_shared_storage_at_its_bandwidth_and_comes_back_the_same(tmp_path, capsys):
    assert run(tmp_path / "whole", 20, "--state-mb", "2") == 0
    assert run(tmp_path / "split", 12, "--state-mb", "2", "--shared-mb-per-s", "40") == 0
    assert sorted(p.name for p in (tmp_path / "split" / "bulk").iterdir()) == ["step-00000005", "step-00000010"]
    capsys.readouterr()
    assert run(tmp_path / "split", 20, "--state-mb", "2", "--shared-mb-per-s", "40") == 0
    said = capsys.readouterr().out
    seconds = float(said.split("2 MB of this rank's bulk state with it, in ")[1].split(" s)")[0])
    assert seconds >= 0.04, "2 MB at 40 MB/s take 50 ms"
    assert final(tmp_path / "split") == final(tmp_path / "whole")
    assert sorted(p.name for p in (tmp_path / "split" / "bulk").iterdir()) == ["step-00000015", "step-00000020"]


def test_bulk_state_that_does_not_read_back_as_saved_stops_the_resume(tmp_path, capsys):
    assert run(tmp_path, 10, "--state-mb", "1") == 0
    shard = tmp_path / "bulk" / "step-00000010" / "rank-0.bin"
    shard.write_bytes(shard.read_bytes()[:-1])
    assert run(tmp_path, 12, "--state-mb", "1") == toy.EXIT_USAGE
    assert "rank-0.bin: the bulk state read back is not the one saved" in capsys.readouterr().out


def test_a_checkpoint_of_two_ranks_resumed_on_one_learns_the_same(tmp_path, monkeypatch, capsys):
    whole = tmp_path / "whole"
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29733",
           "LD_LIBRARY_PATH": "/nonexistent"}
    procs = [subprocess.Popen([sys.executable, str(TRAINER), "--checkpoint-dir", str(whole), "--steps", "20",
                               "--step-time", "0", "--checkpoint-every", "5", "--peer-timeout", "20"],
                              env={**env, "RANK": str(r)}, stdout=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    # The job lost a node and clusterctl went on with one replica: the step-10 checkpoint on one rank.
    monkeypatch.setenv(toy.RESUME_ENV, str(whole / "step-00000010"))
    monkeypatch.setenv("CLUSTERCTL_DP_SIZE", "1")
    monkeypatch.setenv("CLUSTERCTL_DP_SIZE_ORIGINAL", "2")
    assert run(tmp_path / "shrunk", 20) == 0
    assert "world size 1 (2 micro-steps a step: 2 replicas' work on 1); steps 10..20" in capsys.readouterr().out
    shrunk = final(tmp_path / "shrunk")
    assert (shrunk["step"], shrunk["digest"], shrunk["world_size"]) == (20, final(whole)["digest"], 1)


@pytest.mark.parametrize(("size", "original", "says"), [
    ("two", "2", "CLUSTERCTL_DP_SIZE='two' is not a whole number"),
    ("1", "0", "CLUSTERCTL_DP_SIZE_ORIGINAL='0': a data-parallel size is at least 1"),
    ("2", "4", "CLUSTERCTL_DP_SIZE=2 does not divide the world's 1 ranks"),
    ("1", "", "CLUSTERCTL_DP_SIZE_ORIGINAL='' is not a whole number"),
])
def test_data_parallel_sizes_that_make_no_sense_are_a_clear_error(tmp_path, monkeypatch, capsys, size, original,
                                                                  says):
    monkeypatch.setenv("CLUSTERCTL_DP_SIZE", size)
    monkeypatch.setenv("CLUSTERCTL_DP_SIZE_ORIGINAL", original)
    assert run(tmp_path, 5) == toy.EXIT_USAGE
    out = capsys.readouterr().out
    assert says in out and "Traceback" not in out
    assert not (tmp_path / "final.json").exists()


@given(size=st.integers(1, 16), ranks_per_replica=st.integers(1, 8), original=st.integers(1, 32))
def test_shrunk_replicas_cover_the_original_world_s_slots_once_or_are_refused(size, ranks_per_replica, original):
    world = size * ranks_per_replica
    environ = {"CLUSTERCTL_DP_SIZE": str(size), "CLUSTERCTL_DP_SIZE_ORIGINAL": str(original)}
    if original < size:
        with pytest.raises(toy.BadUsage, match="grows back to its spec's size at most"):
            toy.data_parallel(world, environ)
        return
    dp = toy.data_parallel(world, environ)
    computed = sorted(slot for rank in range(world) for slot in dp.slots(rank))
    assert computed == list(range(original * ranks_per_replica))
    assert max(len(dp.slots(rank)) for rank in range(world)) == dp.micro_steps
    if original == size:  # no shrink: every rank its own slot, as before shrinking existed
        assert [list(dp.slots(rank)) for rank in range(world)] == [[rank] for rank in range(world)]
