"""Releases Debian does not ship: the testbed builds them from SchedMD's source tag, in a cached root filesystem."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("clusterctl_testbed", reason="tests the testbed package: pip install -e ./testbed")

from click.testing import CliRunner  # noqa: E402

from clusterctl_testbed import rootfs, slurm_source, system, versions  # noqa: E402
from clusterctl_testbed.cli import cli  # noqa: E402

MIRROR = "http://m/debian"
META_24_05_8 = "##\n# Metadata\n##\n  Meta:\t\t1\n  Name:\t\tslurm\n  Major:\t24\n  Minor:\t05\n  Micro:\t8\n"
# The plugin directory of the 24.05.8 build made here (the names the checks look at, and a few others).
BUILT_PLUGINS = ["accounting_storage_mysql.so", "accounting_storage_slurmdbd.so", "auth_jwt.so", "auth_munge.so",
                 "data_parser_v0_0_39.so", "data_parser_v0_0_40.so", "data_parser_v0_0_41.so", "gres_gpu.so",
                 "select_cons_tres.so", "serializer_json.so", "serializer_yaml.so", "topology_tree.so",
                 "topology_block.so", "serializer_json.la"]


# ---- which release, which tag, which suite

def test_24_05_is_built_from_its_newest_patch_tag_on_bookworm_and_every_tag_matches_its_release():
    release = versions.release("24.05")
    assert (release.source_tag, release.suite, release.version) == ("slurm-24-05-8-1", "bookworm", (24, 5))
    assert release.built_from_source and release.uses_rootfs
    assert not versions.release("24.11").built_from_source
    for r in versions.RELEASES.values():
        if r.source_tag is not None:
            assert versions.tag_version(r.source_tag)[:2] == r.version
    assert release.describe() == "24.05: built from SchedMD's source (tag slurm-24-05-8-1) on Debian bookworm"


def test_the_newest_patch_tag_of_a_line_is_picked_from_schedmds_tags():
    tags = ["slurm-24-05-0-0rc1", "slurm-24-05-9-1", "slurm-24-05-10-1", "slurm-24-11-5-1", "slurm-24-05-10-2",
            "slurm-23-11-11-1", "v24.05", "slurm-24-05-ancient"]
    assert versions.newest_patch_tag(tags, (24, 5)) == "slurm-24-05-10-2"
    assert versions.newest_patch_tag(tags, (23, 11)) == "slurm-23-11-11-1"
    assert versions.newest_patch_tag(tags, (25, 5)) is None
    assert versions.tag_version("slurm-24-05-10-2") == (24, 5, 10)
    with pytest.raises(ValueError, match=r"'24.05.8' is not a Slurm release tag \(slurm-MAJOR-MINOR-MICRO-N\)"):
        versions.tag_version("24.05.8")


@given(st.lists(st.tuples(st.sampled_from([(23, 2), (23, 11), (24, 5), (25, 5)]),
                          st.integers(0, 20), st.integers(1, 3)), min_size=1))
def test_the_newest_patch_tag_is_one_of_the_lines_tags_and_none_of_them_is_newer(releases):
    tags = [f"slurm-{major}-{minor:02d}-{micro}-{n}" for (major, minor), micro, n in releases]
    for line in {line for line, _, _ in releases}:
        newest = versions.newest_patch_tag(tags, line)
        assert newest in tags and versions.tag_version(newest)[:2] == line
        ours = [(micro, n) for rel, micro, n in releases if rel == line]
        assert max(ours) == tuple(int(part) for part in newest.split("-")[3:5])


# ---- the root filesystem's recipe

def test_a_source_built_root_has_what_builds_slurm_and_no_debian_slurm_and_a_cache_of_its_own():
    recipe = rootfs.recipe_for(versions.release("24.05"), mirror=MIRROR)
    argv = recipe.mmdebstrap_argv(Path("/c/new"))
    assert argv[-3:] == ["bookworm", "/c/new", MIRROR]
    included = set(next(a for a in argv if a.startswith("--include=")).removeprefix("--include=").split(","))
    assert not included & {"slurmctld", "slurmd", "slurm-client", "slurmdbd"}
    assert {"munge", "mariadb-server-core", "python3-venv", "gcc", "make", "libmunge-dev", "libmariadb-dev",
            "libjson-c-dev", "libhttp-parser-dev", "libyaml-dev", "libjwt-dev", "libdbus-1-dev", "libhwloc-dev",
            "libpam0g-dev", "libreadline-dev", "pkg-config"} <= included
    assert recipe.name == "bookworm-slurm-24.05"  # never the packaged 22.05's "bookworm"
    assert rootfs.recipe_for(versions.release("22.05"), mirror=MIRROR).name == "bookworm"
    assert rootfs.cached_root(versions.release("24.05"), cache=Path("/c")) == Path("/c/bookworm-slurm-24.05/rootfs")
    assert rootfs.cached_root(versions.release("24.11"), cache=Path("/c")) == Path("/c/trixie/rootfs")


def test_slurm_is_configured_with_debians_paths_and_every_library_the_testbed_needs_niced():
    steps = rootfs.recipe_for(versions.release("24.05"), mirror=MIRROR).build_steps(jobs=2)
    assert [s.what for s in steps] == ["configure", "make", "make install", "ldconfig"]
    configure = steps[0].argv
    assert configure[:6] == ("nice", "-n", "19", "env", "-C", "/usr/src/slurm")
    assert configure[6] == "./configure"
    assert {"--prefix=/usr", "--sysconfdir=/etc/slurm", "--runstatedir=/run", "--with-munge",
            "--with-mysql_config=/usr/bin", "--with-json", "--with-yaml", "--with-jwt",
            "--with-http-parser"} <= set(configure)
    assert steps[1].argv[-2:] == ("make", "-j2") and steps[1].timeout >= 3600
    assert steps[2].argv[-2:] == ("make", "install")
    assert all(s.argv[:3] == ("nice", "-n", "19") for s in steps[:3])
    assert rootfs.recipe_for(versions.release("24.11"), mirror=MIRROR).build_steps(jobs=2) == ()


def test_packaged_roots_keep_their_fingerprint_and_a_source_root_changes_with_its_tag_or_configure():
    # The digests of the root filesystems cached before source builds existed: they must not rebuild.
    assert rootfs.Recipe("bookworm", "http://deb.debian.org/debian").digest() == "1389ee7057ac5d81"
    assert rootfs.Recipe("sid", "http://deb.debian.org/debian", stale_release_file=True).digest() == "e5f334598470f9f9"
    built = rootfs.recipe_for(versions.release("24.05"), mirror=MIRROR)
    assert built.source is not None
    other_tag = rootfs.Recipe(built.suite, MIRROR, built.packages, source=rootfs.SourceBuild("24.05", "slurm-24-05-7-1"))
    other_args = rootfs.Recipe(built.suite, MIRROR, built.packages,
                               source=rootfs.SourceBuild("24.05", built.source.tag, ("--prefix=/usr",)))
    assert len({built.digest(), other_tag.digest(), other_args.digest()}) == 3


def test_a_build_missing_a_plugin_the_testbed_or_json_needs_is_caught():
    assert rootfs.missing_plugins(BUILT_PLUGINS) == []
    without_json = [p for p in BUILT_PLUGINS if not p.startswith(("serializer_json", "data_parser"))]
    assert rootfs.missing_plugins(without_json) == ["serializer_json", "data_parser_v*"]
    assert rootfs.missing_plugins([]) == list(rootfs.REQUIRED_PLUGINS)


# ---- the stamp beside a cached root filesystem

def test_the_stamp_records_tag_commit_and_build_time_and_round_trips():
    built = rootfs.BuiltSlurm("slurm-24-05-8-1", "46879dc2d172fd362745d21730a6846888d10157",
                              "/work/slurm.git", "slurm 24.05.8", 1620.4)
    stamp = rootfs.Stamp("28d27bb501ccd4b1", built)
    text = stamp.render()
    assert rootfs.read_stamp(text) == stamp
    assert json.loads(text)["slurm"]["commit"] == "46879dc2d172fd362745d21730a6846888d10157"
    assert rootfs.read_stamp(rootfs.Stamp("1389ee7057ac5d81").render()) == rootfs.Stamp("1389ee7057ac5d81")


def test_a_stamp_from_before_records_still_reads_and_one_not_understood_means_rebuild():
    assert rootfs.read_stamp("1389ee7057ac5d81\n") == rootfs.Stamp("1389ee7057ac5d81")
    assert rootfs.read_stamp(json.dumps({"format": 2, "recipe": "1389ee7057ac5d81"})) is None
    assert rootfs.read_stamp("{broken") is None
    assert rootfs.read_stamp("") is None


# ---- where the source comes from

def test_the_source_named_is_a_git_directory_a_tarball_or_a_url_and_schedmd_by_default():
    assert slurm_source.choose_source(None) == slurm_source.SourceChoice("url", "https://github.com/SchedMD/slurm.git")
    assert slurm_source.choose_source("/src/slurm").kind == "git"
    assert slurm_source.choose_source("/src/slurm.git").kind == "git"
    for tarball in ("slurm-24.05.8.tar.bz2", "/d/slurm.tar.gz", "x.tar", "x.tgz", "x.tar.xz"):
        assert slurm_source.choose_source(tarball).kind == "tarball"
    for url in ("https://example.org/slurm.git", "file:///srv/slurm.git", "git@example.org:slurm.git"):
        assert slurm_source.choose_source(url) == slurm_source.SourceChoice("url", url)


def test_a_release_tarball_is_unpacked_from_its_top_directory_and_a_git_archive_from_the_top():
    assert slurm_source.top_directory(["slurm-24.05.8/", "slurm-24.05.8/META", "slurm-24.05.8/src/x.c"]) \
        == "slurm-24.05.8"
    assert slurm_source.top_directory(["META", "configure", "src/", "src/x.c"]) is None
    assert slurm_source.top_directory(["./src/", "./src/x.c"]) == "src"


def test_a_tree_of_another_release_is_refused_with_what_to_give():
    release = versions.release("24.05")
    slurm_source.check_tree_version(META_24_05_8, release, "/d/slurm-24.05.8.tar.bz2")
    with pytest.raises(system.TestbedError, match=r"/d/x.tar.bz2 is Slurm 24.05.6, but the testbed's 24.05 is 24.05.8 "
                                           r"\(tag slurm-24-05-8-1\): give that release's tarball"):
        slurm_source.check_tree_version(META_24_05_8.replace("Micro:\t8", "Micro:\t6"), release, "/d/x.tar.bz2")
    with pytest.raises(system.TestbedError, match=r"/d/x.tar is not a Slurm source tree"):
        slurm_source.check_tree_version("hello", release, "/d/x.tar")


def _git(directory: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(directory), *args], check=True, capture_output=True, text=True,
                          env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                               "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}).stdout.strip()


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A git repository shaped like SchedMD's: a tree with META, tagged slurm-24-05-6-1."""
    repo = tmp_path / "slurm"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "META").write_text(META_24_05_8.replace("Micro:\t8", "Micro:\t6"))
    _git(repo, "add", "META")
    _git(repo, "commit", "-q", "-m", "24.05.6")
    _git(repo, "tag", "-a", "-m", "24.05.6", "slurm-24-05-6-1")
    return repo


def test_the_tag_is_exported_from_a_clone_with_its_commit_recorded(clone, tmp_path):
    (clone / "META").write_text(META_24_05_8)
    _git(clone, "commit", "-q", "-am", "24.05.8")
    _git(clone, "tag", "-a", "-m", "24.05.8", "slurm-24-05-8-1")
    tree, origin = slurm_source.export(slurm_source.choose_source(str(clone)), versions.release("24.05"),
                                       tmp_path / "out" / "tree.tar", tmp_path / "cache.git")
    assert origin == slurm_source.Origin("slurm-24-05-8-1", _git(clone, "rev-parse", "HEAD"), str(clone))
    listing = subprocess.run(["tar", "-xOf", str(tree), "META"], capture_output=True, text=True, check=True)
    assert listing.stdout == META_24_05_8


def test_a_clone_without_the_tag_says_which_it_has_and_how_to_get_it(clone, tmp_path):
    with pytest.raises(system.TestbedError) as caught:
        slurm_source.export(slurm_source.choose_source(str(clone)), versions.release("24.05"),
                            tmp_path / "tree.tar", tmp_path / "cache.git")
    message = str(caught.value)
    assert f"{clone} has no tag slurm-24-05-8-1 (its newest 24.05 tag is slurm-24-05-6-1)" in message
    assert "fetch --tags https://github.com/SchedMD/slurm.git" in message


def test_no_source_and_no_network_is_a_message_naming_what_to_give(tmp_path):
    release = versions.release("24.05")
    with pytest.raises(system.TestbedError) as caught:
        slurm_source.export(slurm_source.choose_source(f"file://{tmp_path}/nowhere.git"), release,
                            tmp_path / "tree.tar", tmp_path / "cache.git")
    message = str(caught.value)
    assert message.startswith(f"cannot fetch Slurm 24.05's source (tag slurm-24-05-8-1) from file://{tmp_path}")
    assert "--slurm-source DIR" in message and "CLUSTERCTL_SLURM_SOURCE=DIR" in message
    for missing in (tmp_path / "no-such-dir", tmp_path / "slurm-24.05.8.tar.bz2"):
        with pytest.raises(system.TestbedError, match=r"give SchedMD's source: a clone of https://github.com/SchedMD/slurm"):
            slurm_source.export(slurm_source.choose_source(str(missing)), release, tmp_path / "t.tar", tmp_path / "c")


# ---- the command line and the long build's progress

def test_up_help_names_the_source_built_release_and_where_its_source_comes_from():
    result = CliRunner().invoke(cli, ["up", "--help"], terminal_width=200)
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "24.05: built from SchedMD's source (tag slurm-24-05-8-1) on Debian bookworm" in text
    assert "--slurm-source PATH|URL" in text and "CLUSTERCTL_SLURM_SOURCE" in text


def test_an_unknown_release_on_the_command_line_lists_the_choices():
    result = CliRunner().invoke(cli, ["up", "--slurm", "23.99"])
    assert result.exit_code == 2
    assert ("'23.99' is not one of 'host', '22.05', '23.02', '23.11', '24.05', '24.11', '25.05', '25.11', '26.05'"
            in " ".join(result.output.split()))


def test_a_long_command_reports_where_it_is_and_a_failure_names_its_log(tmp_path):
    log, seen = tmp_path / "build.log", []
    system.run_logged(["sh", "-c", "echo \"make[2]: Entering directory '/usr/src/slurm/src/sinfo'\"; sleep 0.5; echo done"],
                      log, timeout=10, every=0.2, progress=lambda elapsed, lines: seen.append(rootfs.build_position(lines)))
    assert "in src/sinfo" in seen and log.read_text().endswith("done\n")
    failed = tmp_path / "failed.log"
    with pytest.raises(system.TestbedError,
                       match=rf"exited with 2; the end of its output, in {failed}:\nchecking json-c\nerror: no json-c$"):
        system.run_logged(["sh", "-c", "echo checking json-c; echo 'error: no json-c'; exit 2"], failed, timeout=10)
    with pytest.raises(system.TestbedError, match=rf"did not finish within 0.3 s; its output is in {log}"):
        system.run_logged(["sleep", "30"], log, timeout=0.3)


def test_where_a_build_is_is_the_directory_make_entered_last_or_its_last_line():
    assert rootfs.build_position(["make[1]: Entering directory '/usr/src/slurm'", "gcc -c x.c"]) == \
        "in the top directory"
    assert rootfs.build_position(["libtool: compile:  gcc -DHAVE_CONFIG_H -I. -c slurm_opt.c -fPIC -o x.o"]) == \
        "compiling slurm_opt.c"
    assert rootfs.build_position(["checking for json installation... /usr", ""]) == \
        "checking for json installation... /usr"
    assert rootfs.build_position(["x" * 200]) == "x" * 77 + "..."
