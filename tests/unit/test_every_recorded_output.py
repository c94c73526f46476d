"""Every file of every recorded release (tests/data/slurm/*/index.json) goes through the clusterctl code
that reads its command's output, and reads as what the recording script made: each job's state, each
node's state and whose drain it is.  A recorded command clusterctl has no reader for is listed in
NOT_READ with the reason, so a newly recorded command without a reader fails here."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from clusterctl.slurm import hostlist
from clusterctl.slurm.commands import Completed, Runner, Slurm, parse_exit_code
from clusterctl.slurm.jobs import FAMILY_38, job_line_argv, parse_squeue_json
from clusterctl.slurm.nodes import (
    SlurmNode, all_nodes_argv, one_node_text_argv, parse_nodes_json, partition_share_argv,
)
from clusterctl.slurm.topology import parse_scontrol_topology
from clusterctl.slurm.version import SlurmVersionError, parse_version
from tests.recordings import (
    UNFINISHED_ROLES, RecordedFile, Recording, asked_ids, check_job, check_node, option,
)

Reader = Callable[[Recording, RecordedFile], None]


def only(recording: Recording, file: RecordedFile) -> Runner:
    """A runner that answers this file's command (and `sbatch --version`, which the door asks first)
    and nothing else: the reader must read this very file."""
    version = recording.recorded(["sbatch", "--version"])

    def run(argv: Sequence[str], timeout: float) -> Completed:
        if tuple(argv) == file.argv:
            return file.completed
        if list(argv) == ["sbatch", "--version"]:
            return version.completed if version else Completed(0, f"{recording.slurm}\n", "")
        raise AssertionError(f"the reader asked `{' '.join(argv)}`, not this file's command")
    return run


# ---- the readers: clusterctl's own code path for each command, and what a user must see -------------
def read_squeue_json(recording: Recording, file: RecordedFile) -> None:
    slurm, ids = Slurm(only(recording, file)), asked_ids(file.argv)
    through_door = slurm.queue_argv(ids) == list(file.argv)  # what the door asks on this release
    if not through_door and file.returncode != 0:
        # A question the door does not ask on this release (it asks every job at once there); when a
        # release refuses it, it is for the one reason the door would forgive.
        assert len(ids) == 1 and "Invalid job id specified" in file.stderr, file.stderr
        return
    jobs = slurm.queue(ids) if through_door else parse_squeue_json(file.stdout, recording.version, file.argv)
    filtered = recording.version.squeue_json_filters  # else every job slurmctld holds, whatever was asked
    # ... except one `-j ID`, which 23.02 and later honour (seen in 23.11.11's recording).
    one_job = recording.version.json_family != FAMILY_38 and len(ids) == 1
    every_state = option(file.argv, "-t") == "all"
    for role, job_id in recording.jobs.items():
        listed = ((job_id in ids) if one_job and not filtered else
                  not filtered or ((not ids or job_id in ids) and (every_state or role in UNFINISHED_ROLES)))
        shown = listed and (not through_door or not ids or job_id in ids)
        assert (job_id in jobs) == shown, f"job {job_id} ({role}) {'missing' if shown else 'shown'}"
        if shown:
            check_job(recording, role, jobs[job_id])
    unknown = [job_id for job_id in ids if recording.role_of(job_id) is None and job_id in jobs]
    assert not unknown, f"jobs {unknown}, which slurmctld does not hold, are shown"


def read_sacct(recording: Recording, file: RecordedFile) -> None:
    ids = asked_ids(file.argv)
    jobs = Slurm(only(recording, file)).accounting(ids)
    for job_id in ids:
        role = recording.role_of(job_id)
        if role is None:
            assert job_id not in jobs, f"job {job_id}, which accounting never saw, is read as {jobs[job_id]}"
        else:
            check_job(recording, role, jobs.get(job_id), accounting=True)


def read_job_line(recording: Recording, file: RecordedFile) -> None:
    job_id = asked_ids(file.argv)[0]
    report = Slurm(only(recording, file)).job(job_id)
    role = recording.role_of(job_id)
    if role is None:
        assert report is None, f"job {job_id}, which the controller does not hold, is read as {report}"
    else:
        check_job(recording, role, report)


def read_exit_code(recording: Recording, file: RecordedFile) -> None:
    job_id = file.argv[-1]
    expected = 3 if recording.role_of(job_id) == "failed" else 0
    assert parse_exit_code(file.stdout) == (expected, None)


def read_jobs_on_node(recording: Recording, file: RecordedFile) -> None:
    node = option(file.argv, "-w") or ""
    running = recording.nodes.get(node, "").startswith("running a job")
    assert SlurmNode(node, only(recording, file)).jobs_here() == ((recording.jobs["running"],) if running else ())


def read_sbatch_parsable(recording: Recording, file: RecordedFile) -> None:
    job_id = Slurm(only(recording, file)).sbatch(list(file.argv))
    assert job_id.isdigit() and job_id not in recording.jobs.values()


def read_sbatch_version(recording: Recording, file: RecordedFile) -> None:
    release = Slurm(only(recording, file)).release()
    assert release == recording.version, f"sbatch says {release}, index.json's \"slurm\" {recording.slurm!r}"


def read_sinfo_version(recording: Recording, file: RecordedFile) -> None:
    release = parse_version(file.stdout, list(file.argv))
    assert release == recording.version, f"sinfo says {release}, index.json's \"slurm\" {recording.slurm!r}"


def read_nodes_json(recording: Recording, file: RecordedFile) -> None:
    release, argv = recording.version, list(file.argv)
    if argv[0] == "scontrol" and not release.scontrol_node_json:
        assert file.returncode != 0 and all_nodes_argv(release) != argv  # refused, and never asked
        return
    text = Slurm(only(recording, file)).nodes_json() if all_nodes_argv(release) == argv else file.stdout
    flat = release.json_family == FAMILY_38  # one entry per node, and sinfo's filters ignored
    if argv[0] == "sinfo" and not flat and "-N" not in argv and "-n" not in argv:
        # Grouped by state: the admin's drain and healthd's share a group, and its one reason.
        with pytest.raises(SlurmVersionError, match="only the first one's"):
            parse_nodes_json(text, argv, release)
        return
    nodes = {node.name: node for node in parse_nodes_json(text, argv, release)}
    asked = option(argv, "-n") or (argv[3] if argv[:3] == ["scontrol", "show", "node"] and argv[3] != "--json"
                                   else None)
    assert set(nodes) == ({asked} if asked and not flat else set(recording.nodes)), sorted(nodes)
    partition = option(argv, "-p")
    for node in nodes.values():
        check_node(recording, node)
        assert partition is None or partition in node.partitions


def read_one_node(recording: Recording, file: RecordedFile) -> None:
    node = option(file.argv, "-n") or ""
    check_node(recording, SlurmNode(node, only(recording, file)).state())


def read_idle_nodes(recording: Recording, file: RecordedFile) -> None:
    idle = Slurm(only(recording, file)).idle_nodes(option(file.argv, "-p"))
    assert idle == [name for name, description in recording.nodes.items() if description.startswith("idle")]


def read_partition_share(recording: Recording, file: RecordedFile) -> None:
    share = SlurmNode("node1", only(recording, file)).partition_share(option(file.argv, "-p") or "")
    drained_by_healthd = sum("healthd" in description for description in recording.nodes.values())
    assert (share.nodes, share.drained_by_us) == (len(recording.nodes), drained_by_healthd)


def read_partition_size(recording: Recording, file: RecordedFile) -> None:
    assert SlurmNode("node1", only(recording, file)).partition_size(file.argv[3]) == len(recording.nodes)


def read_topology(recording: Recording, file: RecordedFile) -> None:
    topology = parse_scontrol_topology(Slurm(only(recording, file)).show_topology())
    assert set(recording.nodes) <= set(topology.nodes), topology.nodes


def read_topology_plugin(recording: Recording, file: RecordedFile) -> None:
    plugin = Slurm(only(recording, file)).config_value("TopologyPlugin")
    assert plugin is not None and plugin.startswith("topology/"), plugin


def read_hostnames(recording: Recording, file: RecordedFile) -> None:
    assert hostlist.expand(file.argv[-1]) == file.stdout.split()  # clusterctl's expansion is Slurm's


ANY, REST = "*", "..."
"""In a command pattern: any one word; (last) any further words."""

READERS: tuple[tuple[tuple[str, ...], Reader], ...] = (
    (("squeue", "--json", REST), read_squeue_json),
    (tuple(job_line_argv(ANY)), read_job_line),
    (("squeue", "-h", "-w", ANY, "-t", "RUNNING", "-o", "%A"), read_jobs_on_node),
    (("sacct", "--json", "-j", ANY), read_sacct),
    (("scontrol", "show", "job", ANY), read_exit_code),
    (("sbatch", "--parsable", REST), read_sbatch_parsable),
    (("sbatch", "--version"), read_sbatch_version),
    (("sinfo", "--version"), read_sinfo_version),
    (("sinfo", "--json", REST), read_nodes_json),
    (("scontrol", "show", "node", "--json"), read_nodes_json),
    (("scontrol", "show", "node", ANY, "--json"), read_nodes_json),
    (tuple(one_node_text_argv(ANY)), read_one_node),
    (("sinfo", "-h", "-N", "-o", "%N|%T", REST), read_idle_nodes),
    (tuple(partition_share_argv(ANY)), read_partition_share),
    (("scontrol", "show", "partition", ANY), read_partition_size),
    (("scontrol", "show", "topology"), read_topology),
    (("scontrol", "show", "config"), read_topology_plugin),
    (("scontrol", "show", "hostnames", ANY), read_hostnames),
)
"""Each recorded command → the clusterctl code that reads its output (first match wins)."""

NOT_READ: dict[tuple[str, ...], str] = {
    ("squeue", "--only-job-state", REST): "recorded to measure the cheap state RPC (24.05+); clusterctl reads "
                                          "a job's state from one line of text instead (Slurm.job)",
}
"""Recorded commands clusterctl never runs, with the reason."""


def matches(pattern: Sequence[str], argv: Sequence[str]) -> bool:
    """`argv` is an instance of `pattern` (ANY: any one word; REST last: any further words)."""
    if pattern and pattern[-1] == REST:
        fixed = pattern[:-1]
        return len(argv) >= len(fixed) and all(p in (ANY, a) for p, a in zip(fixed, argv))
    return len(argv) == len(pattern) and all(p in (ANY, a) for p, a in zip(pattern, argv))


def reader_of(argv: Sequence[str]) -> Reader | str:
    """The reader of a recorded command's output, or why clusterctl has none; KeyError when neither is known."""
    for pattern, reader in READERS:
        if matches(pattern, argv):
            return reader
    for pattern, reason in NOT_READ.items():
        if matches(pattern, argv):
            return reason
    raise KeyError(" ".join(argv))


def test_every_recorded_output_reads_as_the_recording_script_made_it(recording):
    problems = []
    for file in recording.files.values():
        command = " ".join(file.argv)
        try:
            reader = reader_of(file.argv)
        except KeyError:
            problems.append(f"{file.name}: `{command}` has no reader: add the clusterctl code that reads it to "
                            "READERS, or list it in NOT_READ with the reason")
            continue
        if isinstance(reader, str):
            continue
        try:
            reader(recording, file)
        except Exception as exc:  # every file's problem is listed, not only the first
            problems.append(f"{file.name} (`{command}`, exit {file.returncode}) through {reader.__name__}: "
                            f"{type(exc).__name__}: {exc}")
    assert not problems, f"{recording.where} (Slurm {recording.version}):\n" + "\n".join(problems)


def test_a_command_without_a_reader_is_caught():
    assert reader_of(["squeue", "--json", "-t", "all"]) is read_squeue_json
    assert isinstance(reader_of(["squeue", "--only-job-state", "--json"]), str)
    with pytest.raises(KeyError, match="scontrol show reservation"):
        reader_of(["scontrol", "show", "reservation"])
