"""docs/install.md as a newcomer reads it: the README's first screen sends each reader there, its
links land, and what it tells admins to type exists."""

from __future__ import annotations

import re
import tomllib

from tests.conftest import REPO

INSTALL = (REPO / "docs" / "install.md").read_text()


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors for a page's headings (lowercase, punctuation dropped, spaces to dashes)."""
    return {re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.+)$", markdown, re.M)}


def test_the_readmes_first_screen_says_which_page_is_for_whom():
    first_screen = (REPO / "README.md").read_text().split("## Quick start", 1)[0]
    assert len(first_screen.splitlines()) < 25
    for link in ("docs/install.md#users", "docs/install.md#admins", "#quick-start"):
        assert f"]({link})" in first_screen


def test_every_link_inside_the_install_page_lands():
    anchors = _anchors(INSTALL)
    assert {"users", "admins"} <= anchors
    for target in re.findall(r"\]\(#([^)]+)\)", INSTALL):
        assert target in anchors, target
    for page, anchor in re.findall(r"\]\(([a-z-]+\.md)(?:#([^)]+))?\)", INSTALL):
        text = (REPO / "docs" / page).read_text()
        assert not anchor or anchor in _anchors(text), f"{page}#{anchor}"


def test_the_slurm_conf_lines_name_the_installed_hooks():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    for key, script in (("Prolog", "clusterctl-prolog"), ("Epilog", "clusterctl-epilog"),
                        ("HealthCheckProgram", "clusterctl-healthcheck")):
        assert script in scripts and f"{key}=/opt/clusterctl/bin/{script}" in INSTALL
    assert "PrologFlags=Alloc" in INSTALL
