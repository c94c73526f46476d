"""Which Slurm release answers, and what clusterctl relies on it offering."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clusterctl.errors import SlurmCommandError
from clusterctl.slurm.version import SlurmVersion, SlurmVersionError, parse_version


@pytest.mark.parametrize(("text", "expected"), [
    ("slurm-wlm 22.05.8\n", SlurmVersion(22, 5, 8)),
    ("slurm 24.11.5", SlurmVersion(24, 11, 5)),
    ("slurm 26.05.5\n", SlurmVersion(26, 5, 5)),
    ("slurm 23.02.7-1", SlurmVersion(23, 2, 7)),
])
def test_reads_the_release_each_command_prints(text, expected):
    assert parse_version(text) == expected


def test_each_release_offers_what_the_notes_say():
    old, mid, new = SlurmVersion(22, 5, 8), SlurmVersion(24, 11, 5), SlurmVersion(26, 5, 5)
    assert [v.json_family for v in (old, SlurmVersion(23, 2, 1), mid)] == ["v0.0.38", "v0.0.39", "v0.0.40+"]
    assert not old.squeue_json_filters and not SlurmVersion(24, 5, 0).squeue_json_filters and mid.squeue_json_filters
    assert not old.sacct_exit_code_trustworthy and new.sacct_exit_code_trustworthy
    assert not old.segment and mid.segment and not mid.topology_yaml and new.topology_yaml
    assert str(old) == "22.05.8"


def test_an_older_release_is_refused_with_the_reason():
    with pytest.raises(SlurmVersionError, match="older than the oldest release"):
        parse_version("slurm 21.08.8")


@given(st.text(max_size=40))
def test_any_other_text_is_a_slurm_error_never_a_traceback(text):
    try:
        parse_version(text)
    except SlurmCommandError as exc:
        assert exc.exit_code == 8


FIRST_RELEASE = {
    "scontrol_node_json": (23, 2, 0), "sacct_exit_code_trustworthy": (23, 11, 0), "topology_block": (23, 11, 0),
    "segment": (24, 5, 0), "only_job_state": (24, 5, 0), "squeue_json_filters": (24, 5, 1),
    "topology_yaml": (25, 5, 0), "expedited_requeue": (25, 11, 0), "health_check_start_only": (25, 11, 0),
    "sluid": (25, 11, 0), "topology_ordered_steps": (26, 5, 0),
}
"""Each capability → the first release that has it (each property's docstring says where that comes from; the
25.11 ones are absent from SchedMD's slurm-25-05-8-1 and present in slurm-25-11-0-1, CR_NO_DIST_TOPO_BLOCK absent
from slurm-25-11-7-1 and present in slurm-26-05-0-1)."""

versions = st.builds(SlurmVersion, st.integers(20, 40), st.integers(0, 12), st.integers(0, 20))


def capabilities(version: SlurmVersion) -> set[str]:
    return {name for name in FIRST_RELEASE if getattr(version, name)}


def test_every_capability_has_its_first_release_here():
    properties = {name for name, value in vars(SlurmVersion).items() if isinstance(value, property)}
    assert properties - {"json_family"} == set(FIRST_RELEASE)


@given(versions)
def test_a_release_has_exactly_the_capabilities_that_started_at_or_before_it(version):
    release = (version.major, version.minor, version.micro)
    assert capabilities(version) == {name for name, first in FIRST_RELEASE.items() if release >= first}


@given(versions, versions)
def test_a_newer_release_loses_no_capability(one, other):
    older, newer = sorted((one, other))
    assert capabilities(older) <= capabilities(newer)

