"""The testbed's Slurm configuration, rendered from a Layout, against golden files."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("clusterctl_testbed", reason="tests the testbed package: pip install -e ./testbed")

from clusterctl_testbed import rootfs, slurm_config, versions  # noqa: E402
from clusterctl_testbed.cluster import lendable_python_prefix  # noqa: E402
from clusterctl_testbed.layout import Layout  # noqa: E402
from tests.golden import assert_golden  # noqa: E402

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "golden" / "testbed"
LAYOUT = Layout(root=Path("/tmp/ctb"))
HOOKS = slurm_config.Hooks(Path("/opt/cc/bin/clusterctl-prolog"), Path("/opt/cc/bin/clusterctl-epilog"),
                           Path("/opt/cc/bin/clusterctl-healthcheck"))

RENDERED = {
    "slurm.conf": slurm_config.slurm_conf(LAYOUT, HOOKS),
    "topology.conf": slurm_config.topology_conf(LAYOUT),
    "gres.conf": slurm_config.gres_conf(LAYOUT),
    "slurmdbd.conf": slurm_config.slurmdbd_conf(LAYOUT),
    "hosts": slurm_config.hosts_file(LAYOUT),
}


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_rendered_config_matches_golden(name):
    assert_golden(f"testbed/{name}", RENDERED[name])


def test_hooks_and_their_flags_are_wired():
    conf = RENDERED["slurm.conf"].splitlines()
    assert "Prolog=/opt/cc/bin/clusterctl-prolog" in conf
    assert "Epilog=/opt/cc/bin/clusterctl-epilog" in conf
    assert "PrologFlags=Alloc" in conf
    assert "HealthCheckProgram=/opt/cc/bin/clusterctl-healthcheck" in conf


def test_a_larger_layout_gets_ranges_and_one_line_per_leaf():
    layout = Layout(leaves=(("l1", ("node1", "node2", "node3")), ("l2", ("node4",)), ("l3", ("gpu-a", "gpu-b"))))
    topo = slurm_config.topology_conf(layout).splitlines()
    assert topo[1:] == ["SwitchName=l1 Nodes=node[1-3]", "SwitchName=l2 Nodes=node4",
                        "SwitchName=l3 Nodes=gpu-a,gpu-b", "SwitchName=spine Switches=l1,l2,l3"]
    assert layout.address("node4") == "10.77.0.14"
    assert layout.leaf_of("gpu-b") == "l3"


def test_socket_paths_fit_the_unix_limit():
    assert len(str(LAYOUT.munge_socket)) < 108
    assert len(str(LAYOUT.mysql_socket)) < 108


# ---- Slurm releases: what differs in the rendered config, and how their root filesystems are built

def test_cgroup_plugin_is_autodetect_on_22_05_and_disabled_from_24_05():
    assert slurm_config.cgroup_conf(versions.release("22.05").version) == "CgroupPlugin=autodetect\n"
    assert slurm_config.cgroup_conf(versions.release("host").version) == "CgroupPlugin=autodetect\n"
    for name in ("24.05", "24.11", "26.05"):
        assert slurm_config.cgroup_conf(versions.release(name).version) == "CgroupPlugin=disabled\n"


def test_up_without_a_release_runs_the_newest_and_the_host_release_renders_as_before():
    assert versions.DEFAULT == versions.NEWEST == max(versions.RELEASES, key=lambda n: versions.RELEASES[n].version)
    assert versions.release(versions.DEFAULT).uses_rootfs and not versions.release(versions.HOST).uses_rootfs
    assert slurm_config.slurm_conf(LAYOUT, HOOKS, versions.release("host").version) == RENDERED["slurm.conf"]


def test_each_release_comes_from_the_debian_suite_that_packages_or_builds_it():
    assert {n: r.suite for n, r in versions.RELEASES.items()} == {
        "host": None, "22.05": "bookworm", "23.02": "bookworm", "23.11": "bookworm", "24.05": "bookworm",
        "24.11": "trixie", "25.05": "trixie", "25.11": "trixie", "26.05": "sid"}
    assert [n for n, r in versions.RELEASES.items() if r.built_from_source] == [
        "23.02", "23.11", "24.05", "25.05", "25.11"]


def test_an_unknown_release_names_the_choices():
    with pytest.raises(ValueError, match=r"unknown Slurm release '23.05'; one of: host, 22.05, 23.02, 23.11, 24.05, "
                                         r"24.11, 25.05, 25.11, 26.05"):
        versions.release("23.05")


@pytest.mark.parametrize("text,expected", [("slurm-wlm 22.05.8", (22, 5, 8)), ("slurm 24.11.5\n", (24, 11, 5)),
                                           ("slurm-wlm 26.05.5", (26, 5, 5))])
def test_version_is_read_from_sinfo_version(text, expected):
    assert versions.parse_version(text) == expected


def test_mirror_is_the_first_non_security_uri_of_the_apt_sources():
    sources = ("Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n\n"
               "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n")
    assert rootfs.mirror_from_sources(sources) == "http://mirror.example/debian"
    with pytest.raises(ValueError, match="no Debian mirror"):
        rootfs.mirror_from_sources("Types: deb\n")


def test_sid_is_built_without_checking_its_stale_release_file():
    sid = rootfs.Recipe("sid", "http://m/debian", stale_release_file=True).mmdebstrap_argv(Path("/c/sid"))
    trixie = rootfs.Recipe("trixie", "http://m/debian").mmdebstrap_argv(Path("/c/trixie"))
    assert '--aptopt=Acquire::Check-Valid-Until "false"' in sid
    assert not any("Check-Valid-Until" in a for a in trixie)
    assert trixie[0] == "mmdebstrap" and trixie[-3:] == ["trixie", "/c/trixie", "http://m/debian"]
    assert "--variant=minbase" in trixie
    included = next(a for a in trixie if a.startswith("--include=")).removeprefix("--include=").split(",")
    assert {"slurmctld", "slurmd", "slurm-client", "slurmdbd", "munge", "mariadb-server-core",
            "python3-venv"} <= set(included)


def test_a_root_filesystem_is_stale_when_its_packages_mirror_or_recipe_change():
    base = rootfs.Recipe("trixie", "http://m/debian")
    assert base.digest() == rootfs.Recipe("trixie", "http://m/debian").digest()
    assert base.digest() != rootfs.Recipe("trixie", "http://other/debian").digest()
    assert base.digest() != rootfs.Recipe("trixie", "http://m/debian", packages=(*base.packages, "vim")).digest()
    assert base.digest() != rootfs.Recipe("trixie", "http://m/debian", version=base.version + 1).digest()


def test_the_block_variant_makes_each_leaf_a_block_for_segment():
    layout = Layout(topology="block")
    assert "TopologyPlugin=topology/block" in slurm_config.slurm_conf(layout, HOOKS, (24, 11)).splitlines()
    assert slurm_config.topology_conf(layout).splitlines()[1:] == [
        "BlockName=leaf1 Nodes=node[1-2]", "BlockName=leaf2 Nodes=node[3-4]", "BlockSizes=2,4"]
    assert "TopologyPlugin=topology/tree" in slurm_config.slurm_conf(Layout(), HOOKS, (24, 11)).splitlines()


def test_the_block_variant_is_refused_on_a_slurm_without_topology_block():
    with pytest.raises(ValueError, match=r"topology/block needs Slurm 23.11 or newer; this is 22.05"):
        slurm_config.check_topology(Layout(topology="block"), (22, 5))
    slurm_config.check_topology(Layout(topology="block"), (26, 5))
    with pytest.raises(ValueError, match="unknown topology 'torus'; one of: tree, block"):
        slurm_config.check_topology(Layout(topology="torus"), (26, 5))


def test_a_self_contained_python_is_lent_to_root_filesystems_but_the_systems_own_is_not(tmp_path):
    pyenv = tmp_path / "versions" / "3.11.7"
    (pyenv / "lib").mkdir(parents=True)
    assert lendable_python_prefix(str(pyenv)) == pyenv.resolve()
    assert lendable_python_prefix("/usr") is None  # binding it would replace the root filesystem's /usr
    assert lendable_python_prefix("/usr/local") is None
    assert lendable_python_prefix("/") is None


def test_the_production_profile_renders_slurms_default_timeouts_and_the_fast_one_the_suites():
    production = slurm_config.slurm_conf(Layout(root=Path("/tmp/ctb"), timeouts="production"), HOOKS).splitlines()
    assert {"SlurmdTimeout=300", "MessageTimeout=10", "KillWait=30"} <= set(production)
    assert {"SlurmdTimeout=5", "MessageTimeout=2", "KillWait=5"} <= set(RENDERED["slurm.conf"].splitlines())


def test_an_unknown_timeouts_profile_names_the_choices():
    with pytest.raises(ValueError, match="unknown timeouts profile 'prod'; one of: fast, production"):
        slurm_config.slurm_conf(Layout(root=Path("/tmp/ctb"), timeouts="prod"), HOOKS)
