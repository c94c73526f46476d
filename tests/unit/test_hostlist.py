"""Hostlists agree with Slurm's own `scontrol show hostnames/hostlist` (differential, generated cases)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterctl.errors import HostlistError
from clusterctl.slurm.hostlist import compress, expand

MINIMAL_CONF = "ClusterName=x\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n"


TESTBED_CACHE = Path(os.environ.get("CLUSTERCTL_TESTBED_CACHE", "/var/cache/clusterctl-testbed"))
# Each Slurm release the testbed caches a root filesystem for (bookworm 22.05, trixie 24.11, sid 26.05):
# the same differential test runs against that release's own scontrol, chrooted.
ROOTFS = [path for path in sorted(TESTBED_CACHE.glob("*/rootfs")) if (path / "usr" / "bin" / "scontrol").exists()]


@pytest.fixture(scope="module", params=["host", *(path.parent.name for path in ROOTFS)])
def scontrol(request, tmp_path_factory):
    """Run the real scontrol (the host's, then each cached release's); a valid slurm.conf is enough, no
    controller is needed."""
    if request.param == "host":
        binary = shutil.which("scontrol")
        assert binary, "scontrol (Debian's slurm-client) is needed: run scripts/setup.sh"
        conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
        conf.write_text(MINIMAL_CONF)
        prefix, env = [binary], {**os.environ, "SLURM_CONF": str(conf)}
    else:
        if os.geteuid() != 0 or not shutil.which("chroot"):
            pytest.skip("chrooting into a release's root filesystem needs root")
        root = TESTBED_CACHE / request.param / "rootfs"
        conf = root / "tmp" / f"clusterctl-hostlist-test-{os.getpid()}.conf"
        conf.write_text(MINIMAL_CONF)
        request.addfinalizer(lambda: conf.unlink(missing_ok=True))
        prefix = ["chroot", str(root), "env", f"SLURM_CONF=/tmp/{conf.name}", "scontrol"]
        env = dict(os.environ)

    def run(*args: str) -> str:
        return subprocess.run([*prefix, "show", *args], capture_output=True, text=True, env=env, timeout=30).stdout

    run.release = request.param  # type: ignore[attr-defined]
    return run


prefixes = st.builds(lambda first, rest: first + rest, st.sampled_from("abnx"), st.text(alphabet="abnx-", max_size=3))


@st.composite
def ranges(draw):
    lo = draw(st.integers(0, 120))
    width = draw(st.integers(1, 4))
    hi = draw(st.integers(lo, lo + 4))
    lo_text = f"{lo:0{width}d}"
    return lo_text if hi == lo and draw(st.booleans()) else f"{lo_text}-{hi:0{draw(st.integers(1, 4))}d}"


@st.composite
def items(draw):
    prefix = draw(prefixes)
    groups = draw(st.integers(0, 4))  # three or more groups: Slurm's order is not plain last-fastest
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


@settings(max_examples=100, deadline=None)
@given(expressions)
def test_expand_matches_scontrol(scontrol, expression):
    assert expand(expression) == scontrol("hostnames", expression).split()


@settings(max_examples=100, deadline=None)
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
    if scontrol.release == "host":  # 22.05 rejects (or mangles) it too
        assert scontrol("hostnames", expression).split() in ([], ["n]"])
    # 24.11 and 26.05 accept some of these ("x[1-3]y" -> x1y...): clusterctl stays with 22.05's refusal,
    # so one spec means the same on every release (refused, never read two ways).


def test_huge_ranges_are_refused():
    with pytest.raises(HostlistError, match="too large|more than"):
        expand("n[0-99999999]")


def test_several_bracket_groups_expand_in_slurms_order():
    assert expand("a[1-2]b[3-4]c[5-6]") == ["a1b3c5", "a1b3c6", "a2b3c5", "a2b3c6",
                                            "a1b4c5", "a1b4c6", "a2b4c5", "a2b4c6"]


@pytest.mark.parametrize("expression", ["n[\u0663]", "n[1-\u0663]", "n[\u00b2]", "n[\uff11-\uff13]"])
def test_numbers_must_be_ascii_digits_as_slurm_says(scontrol, expression):
    expression = expression.encode().decode("unicode_escape")
    with pytest.raises(HostlistError, match="ASCII digits"):
        expand(expression)
    assert scontrol("hostnames", expression).split() == []


@pytest.mark.parametrize("expression", ["n[1-70000]", "n[" + "9" * 5000 + "]", "n[1-" + "9" * 40 + "]"])
def test_huge_numbers_and_ranges_are_refused_with_one_line(expression):
    with pytest.raises(HostlistError, match="too large|longer than"):
        expand(expression)


def test_a_product_of_groups_is_counted_before_it_is_built():
    import time
    start = time.monotonic()
    with pytest.raises(HostlistError, match="more than 1,000,000 hosts"):
        expand("a[1-60000]b[1-60000]c[1-60000]")
    assert time.monotonic() - start < 2.0


def test_a_name_with_a_very_long_number_compresses_as_itself():
    name = "n" + "1" * 5000
    assert compress([name]) == name and expand(compress([name])) == [name]
