"""The compose testbed's services, rendered from the same Layout as the namespace testbed."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("clusterctl_testbed", reason="tests the testbed package: pip install -e ./testbed")

from clusterctl_testbed.compose import (  # noqa: E402
    DATABASE, Images, compose_file, compose_layout, image_tag, shared_dir, to_yaml,
)
from clusterctl_testbed.versions import RELEASES  # noqa: E402
from tests.golden import assert_golden  # noqa: E402

LAYOUT = compose_layout("ctd")
IMAGES = Images("ctd-slurm:26.05-abc", "ctd-slurm:22.05-def", base="debian:sid-slim")
REPO = Path("/src/clusterctl")
RENDERED = compose_file(LAYOUT, IMAGES, repo=REPO)
SERVICES = RENDERED["services"]


def test_the_compose_file_matches_golden():
    assert_golden("testbed/compose.yaml", to_yaml(RENDERED) + "\n")


def test_one_service_per_host_plus_the_database_each_at_its_layout_address():
    assert list(SERVICES) == [DATABASE, "ctl", "node1", "node2", "node3", "node4"]
    for host in LAYOUT.hosts:
        assert SERVICES[host]["hostname"] == host
        assert SERVICES[host]["networks"] == {"ctd-net": {"ipv4_address": LAYOUT.address(host)}}
    assert RENDERED["networks"]["ctd-net"]["ipam"] == {"config": [{"subnet": "10.78.0.0/24"}]}
    assert RENDERED["networks"]["ctd-net"]["internal"] is True


def test_every_slurm_host_reads_the_slurm_config_the_namespace_testbed_renders():
    for host in LAYOUT.hosts:
        assert f"{LAYOUT.etc}:/etc/slurm:ro" in SERVICES[host]["volumes"]


def mounts(service: dict) -> dict[str, tuple[str, str]]:
    """A service's bind mounts: target -> (source, mode)."""
    found = {}
    for volume in service["volumes"]:
        source, target, *mode = volume.split(":")
        found[target] = (source, mode[0] if mode else "rw")
    return found


def test_no_container_sees_the_machines_tmp_only_the_testbeds_own_directories_and_the_checkout():
    # Issue 27: the containers run as root with SYS_ADMIN; the machine's /tmp holds every user's files.
    allowed = (LAYOUT.root, shared_dir(LAYOUT), REPO)
    for service in SERVICES.values():
        for target, (source, _) in mounts(service).items():
            assert any(Path(source) == top or top in Path(source).parents for top in allowed), (source, target)
            assert Path(source) != Path("/tmp") and Path(target) != Path("/tmp")


def test_the_root_and_the_shared_directory_are_the_only_writable_shared_mounts_each_at_its_own_path():
    shared = shared_dir(LAYOUT)
    assert shared == Path("/tmp/ctd/ctd-shared")  # beside the root, not in it: `down` empties the root
    for host in LAYOUT.hosts:
        found = mounts(SERVICES[host])
        assert found[str(LAYOUT.root)] == (str(LAYOUT.root), "rw")
        assert found[str(shared)] == (str(shared), "rw")
        assert found[str(REPO)] == (str(REPO), "ro") and found["/opt/clusterctl-src"] == (str(REPO), "ro")
        per_host = {"/run/healthd"} if host in LAYOUT.nodes else set()
        writable = {target for target, (_, mode) in found.items() if mode == "rw"}
        assert writable == {str(LAYOUT.root), str(shared)} | per_host


def test_the_database_host_sees_the_testbeds_root_alone():
    assert SERVICES[DATABASE]["volumes"] == [f"{LAYOUT.root}:{LAYOUT.root}"]


def test_a_given_shared_directory_replaces_the_default():
    volumes = compose_file(LAYOUT, IMAGES, repo=REPO, shared=Path("/scratch/t27"))["services"]["node2"]["volumes"]
    assert "/scratch/t27:/scratch/t27" in volumes and f"{shared_dir(LAYOUT)}:{shared_dir(LAYOUT)}" not in volumes


def test_only_compute_nodes_get_gpus_and_each_only_its_own():
    for node in LAYOUT.nodes:
        gpu_mounts = [v for v in SERVICES[node]["volumes"] if "/usr/local/nvidia/nvml/" in v]
        assert gpu_mounts == [f"{LAYOUT.nvml_dir / node}:/usr/local/nvidia/nvml/{node}:ro"]
        assert f"{LAYOUT.host_dir(node) / 'etc-clusterctl'}:/etc/clusterctl:ro" in SERVICES[node]["volumes"]
    assert not [v for v in SERVICES["ctl"]["volumes"] if "nvidia" in v]
    assert not [v for v in SERVICES[DATABASE]["volumes"] if "nvidia" in v]


def test_a_users_machine_builds_from_the_debian_image_of_the_release():
    build = SERVICES["node1"]["build"]
    assert build == {"context": str(REPO), "dockerfile": "compose/Dockerfile",
                     "args": {"BASE": "debian:sid-slim", "REPO": str(REPO)}}
    assert SERVICES[DATABASE]["image"] == "ctd-slurm:22.05-def" and SERVICES["ctl"]["image"] == "ctd-slurm:26.05-abc"


def test_image_tags_name_release_and_recipe():
    assert image_tag(RELEASES["24.11"], "0123456789ab") == "ctd-slurm:24.11-0123456789ab"


def test_yaml_writer_nests_mappings_and_lists_and_quotes_strings():
    text = to_yaml({"a": {"b": [1, {"c": "x:y", "d": True}], "e": []}})
    assert text == 'a:\n  b:\n    - 1\n    - c: "x:y"\n      d: true\n  e: []'
