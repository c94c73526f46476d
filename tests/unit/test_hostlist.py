"""Hostlists agree with Slurm's own `scontrol show hostnames/hostlist` (differential, generated cases)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterctl.errors import HostlistError
from clusterctl.slurm.hostlist import compress, expand

MINIMAL_CONF = "ClusterName=x\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n"


@pytest.fixture(scope="module")
def scontrol(tmp_path_factory):
    """Run the real scontrol; a valid slurm.conf is enough, no controller is needed."""
    binary = shutil.which("scontrol")
    assert binary, "scontrol (Debian's slurm-client) is needed: run scripts/setup.sh"
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text(MINIMAL_CONF)
    env = {**os.environ, "SLURM_CONF": str(conf)}

    def run(*args: str) -> str:
        return subprocess.run([binary, "show", *args], capture_output=True, text=True, env=env, timeout=30).stdout

    return run


prefixes = st.builds(lambda first, rest: first + rest, st.sampled_from("abnx"), st.text(alphabet="abnx-", max_size=3))


@st.composite
def ranges(draw):
    lo = draw(st.integers(0, 120))
    width = draw(st.integers(1, 4))
    hi = draw(st.integers(lo, lo + 12))
    lo_text = f"{lo:0{width}d}"
    return lo_text if hi == lo and draw(st.booleans()) else f"{lo_text}-{hi:0{draw(st.integers(1, 4))}d}"


@st.composite
def items(draw):
    prefix = draw(prefixes)
    groups = draw(st.integers(0, 2))
    text = prefix
    for i in range(groups):
        text += "[" + ",".join(draw(st.lists(ranges(), min_size=1, max_size=3))) + "]"
        if i + 1 < groups:
            text += draw(st.sampled_from(["", "-", "x"]))
    if groups == 0:
        text += draw(st.sampled_from(["", "1", "07", "10"]))
    return text


expressions = st.lists(items(), min_size=1, max_size=4).map(",".join)
names = st.lists(st.builds(lambda p, n, w: f"{p}{n:0{w}d}" if n >= 0 else p, prefixes, st.integers(-1, 130),
                           st.integers(1, 4)), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(expressions)
def test_expand_matches_scontrol(scontrol, expression):
    assert expand(expression) == scontrol("hostnames", expression).split()


@settings(max_examples=150, deadline=None)
@given(names)
def test_compress_matches_scontrol(scontrol, host_names):
    assert compress(host_names) == scontrol("hostlist", ",".join(host_names)).strip()


@given(names)
def test_expand_of_compress_is_identity(host_names):
    assert expand(compress(host_names)) == host_names


@pytest.mark.parametrize("expression, message", [
    ("n[3-1]", "invalid range '3-1' (end before start)"),
    ("n[1-2", "'[' is never closed"),
    ("n[1-2]]", "']' without '['"),
    ("n[a-b]", "invalid range 'a-b'"),
    ("x[1-3]y", "text 'y' after ']' is not allowed"),
    ("n[[1]]", "nested '['"),
])
def test_malformed_expressions_are_rejected_like_slurm(scontrol, expression, message):
    with pytest.raises(HostlistError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        expand(expression)
    assert scontrol("hostnames", expression).split() in ([], ["n]"])  # Slurm rejects (or mangles) it too


def test_huge_ranges_are_refused():
    with pytest.raises(HostlistError, match="too large|more than"):
        expand("n[0-99999999]")
