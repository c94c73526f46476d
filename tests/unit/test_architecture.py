"""The dependency rules of docs/architecture.md, checked on the source.

import-linter cannot see this layout (grimp walks `clusterctl/` only and never finds the folders
pyproject.toml maps into the package, such as launcher/ = clusterctl.launcher), so this test reads
the same mapping from pyproject.toml and every import statement with `ast`, including imports
inside functions and under TYPE_CHECKING.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Which parts each part may import (besides the standard library and its dependencies).
ALLOWED = {
    "core": {"core"},
    "launcher": {"core", "launcher"},
    "healthd": {"core", "healthd"},
    "prolog": {"core", "healthd", "prolog"},
    "epilog": {"core", "healthd", "epilog"},
    "sbatch_templates": {"core", "sbatch_templates"},
}
# The command-line edge: click and rich only here.  `*/cli.py` parse arguments; `*_view.py`
# only render.  status.py and report.py still keep their rendering next to the data they show.
COMMAND_LINE_LIBRARIES = {"click", "rich"}
VIEW_MODULES = {"clusterctl.launcher.status", "clusterctl.launcher.report"}
# Names that exist only in a checkout (or in the development-only testbed), never in the wheel.
NOT_IN_THE_WHEEL = {"launcher", "healthd", "prolog", "epilog", "sbatch_templates", "testbed", "clusterctl_testbed"}


@dataclass(frozen=True)
class Import:
    """One import statement: who imports what, where."""

    module: str
    target: str
    file: Path
    line: int


def source_folders(root: Path) -> dict[str, Path]:
    """Package name → source folder, as pyproject.toml maps them (`clusterctl` is its own folder)."""
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"clusterctl": root / "clusterctl"}
    folders.update({name: root / folder for name, folder in config.get("package-dir", {}).items()})
    return folders


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package: dotted name → file."""
    found: dict[str, Path] = {}
    for package, folder in source_folders(root).items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([package, *parts])
            # A mapped folder (launcher/) wins over a same-named one inside clusterctl/.
            if name not in found or folder != root / "clusterctl":
                found[name] = path
    return found


def part(module: str) -> str:
    """The part a clusterctl module belongs to: launcher, healthd, prolog, epilog, ... or core."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 and pieces[1] in ALLOWED else "core"


def imports(root: Path) -> Iterator[Import]:
    """Every import statement in the package's source, with relative imports resolved."""
    known = modules(root)
    for module, path in known.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield Import(module, alias.name, path, node.lineno)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in node.names:
                    # `from clusterctl import launcher` imports the subpackage clusterctl.launcher.
                    sub = f"{base}.{alias.name}"
                    yield Import(module, sub if sub in known else base, path, node.lineno)


def violations(root: Path) -> list[str]:
    """Every import that breaks a rule of ALLOWED, each as `file:line: what`."""
    found = []
    for imp in imports(root):
        top = imp.target.split(".")[0]
        if top == "clusterctl":
            source, target = part(imp.module), part(imp.target)
            if target not in ALLOWED[source]:
                found.append(f"{imp.file.relative_to(root)}:{imp.line}: {imp.module} ({source}) imports "
                             f"{imp.target} ({target}); {source} may import only {sorted(ALLOWED[source])}")
        elif top in NOT_IN_THE_WHEEL:
            found.append(f"{imp.file.relative_to(root)}:{imp.line}: {imp.module} imports `{imp.target}`, which the "
                         f"wheel does not install; import it as clusterctl.{imp.target}")
        elif top in COMMAND_LINE_LIBRARIES:
            name = imp.module.rpartition(".")[2]
            if name != "cli" and not name.endswith("_view") and imp.module not in VIEW_MODULES:
                found.append(f"{imp.file.relative_to(root)}:{imp.line}: {imp.module} imports {top}; click and rich "
                             f"belong in a cli.py or a *_view.py module")
    return found


def reachable(root: Path, start: str, forbidden: str) -> list[str] | None:
    """A chain of imports from part `start` to part `forbidden`, or None when there is none."""
    known = modules(root)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for imp in imports(root):
        target = imp.target
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target:
            graph[imp.module].add(target)
    came_from: dict[str, str | None] = {m: None for m in known if part(m) == start}
    queue = list(came_from)
    while queue:
        module = queue.pop(0)
        if part(module) == forbidden:
            chain = [module]
            while (previous := came_from[chain[-1]]) is not None:
                chain.append(previous)
            return chain[::-1]
        for target in sorted(graph[module]):
            if target not in came_from:
                came_from[target] = module
                queue.append(target)
    return None


def test_every_part_of_the_package_is_read():
    found = {part(m) for m in modules(REPO)}
    assert found == set(ALLOWED), "a folder mapped in pyproject.toml is missing, or a new part needs a rule here"
    assert len(list(imports(REPO))) > 100


def test_each_part_imports_only_what_it_may():
    assert violations(REPO) == []


def test_launcher_and_healthd_never_reach_each_other_even_indirectly():
    assert reachable(REPO, "launcher", "healthd") is None
    assert reachable(REPO, "healthd", "launcher") is None


def test_the_rules_catch_a_launcher_module_that_imports_healthd(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools.package-dir]\n"clusterctl.launcher" = "launcher"\n"clusterctl.healthd" = "healthd"\n')
    for folder in ("clusterctl", "clusterctl/slurm", "launcher", "healthd"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "healthd" / "policy.py").write_text("X = 1\n")
    (tmp_path / "clusterctl" / "slurm" / "nodes.py").write_text("from clusterctl.launcher import submit\n")
    (tmp_path / "launcher" / "submit.py").write_text("import click\nfrom .. import healthd\n")
    (tmp_path / "launcher" / "classify.py").write_text(
        "def blame():\n    from clusterctl.healthd.policy import X\n    return X\n")

    assert violations(tmp_path) == [
        "clusterctl/slurm/nodes.py:1: clusterctl.slurm.nodes (core) imports clusterctl.launcher.submit (launcher); "
        "core may import only ['core']",
        "launcher/classify.py:2: clusterctl.launcher.classify (launcher) imports clusterctl.healthd.policy (healthd); "
        "launcher may import only ['core', 'launcher']",
        "launcher/submit.py:1: clusterctl.launcher.submit imports click; click and rich belong in a cli.py or a "
        "*_view.py module",
        "launcher/submit.py:2: clusterctl.launcher.submit (launcher) imports clusterctl.healthd (healthd); "
        "launcher may import only ['core', 'launcher']",
    ]
    assert reachable(tmp_path, "launcher", "healthd") == ["clusterctl.launcher.classify", "clusterctl.healthd.policy"]
