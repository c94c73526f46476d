"""The dependency rules of docs/architecture.md, checked on the source.

Every import statement is read with `ast` (imports inside functions and under TYPE_CHECKING
too), and so is every module named as a string: `python -m clusterctl...` in an sbatch template,
`"-m", "clusterctl..."` in an argv list, `importlib.resources.files("clusterctl...")`.  A module
started as a process is a dependency too, so it obeys the same rules, with one listed exception
per process boundary that a typed record crosses.

The checkout has the installed layout: clusterctl/launcher is a symlink to ../launcher (and
likewise for healthd, prolog, epilog, sbatch_templates), so the package is read from clusterctl/.
"""

from __future__ import annotations

import ast
import os
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# The parts and which parts each may import (besides the standard library and its dependencies).
# The launcher is four parts, one per place its code runs.
ALLOWED = {
    "core": {"core"},
    "launcher": {"launcher"},  # the package's own __init__: a docstring
    "launcher.pure": {"core", "launcher.pure"},
    "launcher.shared": {"core", "launcher.pure", "launcher.shared"},
    "launcher.job": {"core", "launcher.pure", "launcher.shared", "launcher.job"},
    "launcher.login": {"core", "launcher.pure", "launcher.shared", "launcher.login"},
    "healthd": {"core", "healthd"},
    "prolog": {"core", "healthd", "prolog"},
    "epilog": {"core", "healthd", "epilog"},
    "sbatch_templates": {"core", "sbatch_templates"},
}
# Processes one part may start from another part's module: the answer comes back as a typed
# record, never as an import.  (part that starts it, part of the module started) → the record.
PROCESS_BOUNDARIES = {
    ("launcher.shared", "healthd"): "gpu_evidence (healthd evidence --job-gpus --json, run on a slow node)",
    ("launcher.pure", "launcher.job"): "none: a pure function builds the argv (torchrun's workers), the job runs it",
}
# Inside the core, arrows that may point one way only: (importer, imported) → why.
ONE_WAY = {
    ("clusterctl.slurm", "clusterctl.records"): "the Slurm door imports no record: records are written in the door's "
                                                "terms (node names, NodeState, drain owners), never the other way",
}
# Each Slurm hook keeps its own flow in its folder: its console entry point (pyproject's [project.scripts]) is
# the folder's hook.py, which runs the folder's run.py.  What the hooks share with each other and with the
# HealthCheckProgram is healthd's (clusterctl.healthd.hook_common), since healthd imports neither hook.
HOOKS = {"prolog": ("clusterctl-prolog", "clusterctl.prolog.run"),
         "epilog": ("clusterctl-epilog", "clusterctl.epilog.run")}
# What the sbatch templates may run inside a job.
TEMPLATES_RUN = {"launcher.job"}
PARTS_WITH_FOLDERS = ("launcher", "healthd", "prolog", "epilog", "sbatch_templates")
# Pure judgement touches nothing that runs: no processes, sockets, threads, signals, clocks,
# file locks, HTTP, GPUs or terminals.
NOT_PURE = {"subprocess", "socket", "threading", "multiprocessing", "signal", "fcntl", "shutil", "time", "asyncio",
            "select", "urllib", "http", "requests", "psutil", "pynvml", "prometheus_client", "click", "rich"}
# The command-line edge: click and rich only here.  `*/cli.py` parse arguments; `*_view.py`
# only render.  status.py and report.py still keep their rendering next to the data they show.
COMMAND_LINE_LIBRARIES = {"click", "rich"}
VIEW_MODULES = {"clusterctl.launcher.login.status", "clusterctl.launcher.login.report"}
# Training frameworks, which the base install does not bring (the `frameworks` extra): imported only by
# the callbacks in clusterctl/integrations/ (in the ranks, by the training program), which nothing of
# clusterctl imports in turn.
FRAMEWORKS = {"lightning", "pytorch_lightning", "transformers", "accelerate", "deepspeed"}
INTEGRATIONS = "clusterctl.integrations"
# Names that exist only in a checkout (or in the development-only testbed), never in the wheel.
NOT_IN_THE_WHEEL = {"launcher", "healthd", "prolog", "epilog", "sbatch_templates", "testbed", "clusterctl_testbed"}
MODULE_NAME = re.compile(r"\bclusterctl(?:\.[a-z_][a-z0-9_]*)+")
MODULE_RUN_IN_SHELL = re.compile(r"-m\s+[\"']?(clusterctl(?:\.[a-z_][a-z0-9_]*)+)")


@dataclass(frozen=True)
class Import:
    """One dependency: who imports (or starts) what, where."""

    module: str
    target: str
    file: Path
    line: int
    started: bool = False  # a process (`-m` in an argv or a template), not an import


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package: dotted name → file, read from clusterctl/ (links followed)."""
    found: dict[str, Path] = {}
    package = root / "clusterctl"
    for folder, _dirs, files in sorted(_walk(package)):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            parts = list((folder / name).relative_to(package).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(["clusterctl", *parts])] = folder / name
    return found


def _walk(top: Path) -> Iterator[tuple[Path, list[str], list[str]]]:
    for folder, dirs, files in os.walk(top, followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        yield Path(folder), dirs, files


def part(module: str) -> str:
    """The part a clusterctl module belongs to: launcher.pure, ..., healthd, prolog, ... or core."""
    pieces = module.split(".")
    if len(pieces) > 2 and f"{pieces[1]}.{pieces[2]}" in ALLOWED:
        return f"{pieces[1]}.{pieces[2]}"
    return pieces[1] if len(pieces) > 1 and pieces[1] in ALLOWED else "core"


def _docstring_nodes(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _started_modules(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """Module names a piece of code runs: the string after "-m" in a list or tuple literal, and
    every module named in a `-c` program."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)):
            items = node.elts
            for flag, value in zip(items, items[1:]):
                if not (isinstance(flag, ast.Constant) and isinstance(value, ast.Constant)):
                    continue
                if flag.value == "-m" and isinstance(value.value, str):
                    yield value.value, value.lineno
                elif flag.value == "-c" and isinstance(value.value, str):
                    for name in MODULE_NAME.findall(value.value):
                        yield name, value.lineno


def imports(root: Path) -> Iterator[Import]:
    """Every import statement and every started module of the package, relative imports resolved."""
    known = modules(root)
    for module, path in known.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
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
        for name, line in _started_modules(tree):
            yield Import(module, name, path, line, started=True)


def named_modules(root: Path) -> Iterator[tuple[Path, int, str]]:
    """Every clusterctl module named in a string outside docstrings (code) or in a template."""
    for path in modules(root).values():
        tree = ast.parse(path.read_text(), str(path))
        docstrings = _docstring_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                for name in MODULE_NAME.findall(node.value):
                    yield path, node.lineno, name
    for template in sorted((root / "sbatch_templates").glob("*.sbatch")):
        for number, text in enumerate(template.read_text().splitlines(), 1):
            for name in MODULE_NAME.findall(text):
                yield template, number, name


def unknown_module_names(root: Path) -> list[str]:
    """Names in strings or templates that are no module or package of clusterctl, nor a name in one
    (`clusterctl.progress.beat` in a message): a rename missed."""
    known = modules(root)
    found = []
    for path, line, name in named_modules(root):
        owner = known.get(name.rpartition(".")[0])
        if name not in known and (owner is None or owner.name == "__init__.py"):
            found.append(f"{path.relative_to(root)}:{line}: names {name}, which is no module of clusterctl")
    return found


def template_violations(root: Path) -> list[str]:
    """Templates run only in-job modules, each one runnable with `python -m`."""
    known = modules(root)
    found = []
    for template in sorted((root / "sbatch_templates").glob("*.sbatch")):
        for number, text in enumerate(template.read_text().splitlines(), 1):
            for name in MODULE_RUN_IN_SHELL.findall(text):
                where = f"sbatch_templates/{template.name}:{number}"
                if part(name) not in TEMPLATES_RUN:
                    found.append(f"{where}: runs {name} ({part(name)}); a job script runs only {sorted(TEMPLATES_RUN)}")
                elif name in known and known[name].name == "__init__.py" and f"{name}.__main__" not in known:
                    found.append(f"{where}: runs the package {name}, which has no __main__.py")
    return found


def violations(root: Path) -> list[str]:
    """Every import or started module that breaks a rule, each as `file:line: what`."""
    found = []
    for imp in imports(root):
        top = imp.target.split(".")[0]
        where = f"{imp.file.relative_to(root)}:{imp.line}"
        source = part(imp.module)
        for (lower, upper), why in ONE_WAY.items():
            if _within(imp.module, lower) and _within(imp.target, upper):
                found.append(f"{where}: {imp.module} imports {imp.target}; {why}")
        if top in FRAMEWORKS and not _within(imp.module, INTEGRATIONS):
            found.append(f"{where}: {imp.module} imports {top}, a training framework the base install lacks; "
                         f"only the callbacks in clusterctl/integrations/ import one")
        if _within(imp.target, INTEGRATIONS) and not _within(imp.module, INTEGRATIONS):
            found.append(f"{where}: {imp.module} imports {imp.target}; the framework callbacks are the training "
                         f"program's to import, never clusterctl's (their frameworks are not in the base install)")
        if top == "clusterctl":
            target = part(imp.target)
            if target in ALLOWED[source]:
                continue
            if imp.started and (source, target) in PROCESS_BOUNDARIES:
                continue
            how = "starts" if imp.started else "imports"
            found.append(f"{where}: {imp.module} ({source}) {how} {imp.target} ({target}); "
                         f"{source} may {'start' if imp.started else 'import'} only {sorted(ALLOWED[source])}")
        elif top in NOT_IN_THE_WHEEL:
            found.append(f"{where}: {imp.module} imports `{imp.target}`, which the "
                         f"wheel does not install; import it as clusterctl.{imp.target}")
        else:
            if top in COMMAND_LINE_LIBRARIES:
                name = imp.module.rpartition(".")[2]
                if name != "cli" and not name.endswith("_view") and imp.module not in VIEW_MODULES:
                    found.append(f"{where}: {imp.module} imports {top}; click and rich "
                                 f"belong in a cli.py or a *_view.py module")
                    continue
            if source == "launcher.pure" and top in NOT_PURE:
                found.append(f"{where}: {imp.module} (launcher.pure) imports {top}; pure judgement "
                             f"has no side effects: put the effect in launcher.shared, job or login and pass it in")
    return found


def hook_room_violations(root: Path) -> list[str]:
    """Each hook's console entry point is its folder's hook.py, and that module runs its folder's flow (`HOOKS`)."""
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    known = modules(root)
    imported = {(imp.module, imp.target) for imp in imports(root) if not imp.started}
    found = []
    for hook, (script, flow) in HOOKS.items():
        entry = f"clusterctl.{hook}.hook"
        if scripts.get(script) != f"{entry}:main":
            found.append(f"pyproject.toml: {script} runs {scripts.get(script)}, not {entry}:main")
        if flow not in known:
            found.append(f"{hook}/: no {flow}, the module of the {hook}'s own flow")
        elif (entry, flow) not in imported:
            found.append(f"{entry} does not run {flow}: the {hook}'s flow belongs in its own folder")
    return found


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def reachable(root: Path, start: str, forbidden: str) -> list[str] | None:
    """A chain of imports from part `start` to a part whose name begins with `forbidden`, or None."""
    known = modules(root)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for imp in imports(root):
        target = imp.target
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and not imp.started:
            graph[imp.module].add(target)
    came_from: dict[str, str | None] = {m: None for m in known if part(m) == start}
    queue = list(came_from)
    while queue:
        module = queue.pop(0)
        if part(module) == forbidden or part(module).startswith(forbidden + "."):
            chain = [module]
            while (previous := came_from[chain[-1]]) is not None:
                chain.append(previous)
            return chain[::-1]
        for target in sorted(graph[module]):
            if target not in came_from:
                came_from[target] = module
                queue.append(target)
    return None


def import_cycles(root: Path, prefix: str) -> list[list[str]]:
    """Cycles among the modules under `prefix` (imports anywhere in a module, lazy ones too)."""
    known = modules(root)
    graph: dict[str, set[str]] = {name: set() for name in known if name.startswith(prefix)}
    for imp in imports(root):
        target = imp.target
        while target and target not in known:
            target = target.rpartition(".")[0]
        if imp.module in graph and target in graph and target != imp.module and not imp.started:
            graph[imp.module].add(target)
    cycles, done = [], set()
    for start in sorted(graph):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph[node]):
                if nxt == start and len(path) > 1:
                    cycle = frozenset(path)
                    if cycle not in done:
                        done.add(cycle)
                        cycles.append(path + [start])
                elif nxt not in path and nxt > start:
                    stack.append((nxt, path + [nxt]))
    return cycles


def test_every_part_of_the_package_is_read():
    found = {part(m) for m in modules(REPO)}
    assert found == set(ALLOWED), "a folder is missing from clusterctl/, or a new part needs a rule here"
    assert len(list(imports(REPO))) > 100


def test_the_checkout_has_the_installed_layout():
    for name in PARTS_WITH_FOLDERS:
        link = REPO / "clusterctl" / name
        assert link.is_symlink() and link.resolve() == (REPO / name).resolve(), (
            f"clusterctl/{name} must be a relative symlink to ../{name}")


def test_each_part_imports_only_what_it_may():
    assert violations(REPO) == []


def test_every_module_named_in_a_string_or_template_exists():
    assert unknown_module_names(REPO) == []


def test_templates_run_only_in_job_modules():
    assert template_violations(REPO) == []


def test_launcher_and_healthd_never_reach_each_other_even_indirectly():
    assert reachable(REPO, "launcher.login", "healthd") is None
    assert reachable(REPO, "launcher.job", "healthd") is None
    assert reachable(REPO, "healthd", "launcher") is None


def test_in_job_code_never_reaches_the_login_node_code():
    assert reachable(REPO, "launcher.job", "launcher.login") is None


def test_each_hook_runs_its_own_flow_from_its_own_folder():
    assert hook_room_violations(REPO) == []
    assert reachable(REPO, "prolog", "epilog") is None
    assert reachable(REPO, "epilog", "prolog") is None


def test_the_launcher_has_no_import_cycles():
    assert import_cycles(REPO, "clusterctl.launcher") == []


def _plant(root: Path, files: dict[str, str]) -> None:
    for folder in ("clusterctl", "clusterctl/slurm", "launcher", "launcher/pure", "launcher/job", "launcher/login",
                   "launcher/shared", "healthd", "sbatch_templates"):
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "__init__.py").write_text("")
    for name in PARTS_WITH_FOLDERS:
        if (root / name).exists() and not (root / "clusterctl" / name).exists():
            (root / "clusterctl" / name).symlink_to(f"../{name}")
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_rules_catch_planted_violations(tmp_path):
    _plant(tmp_path, {
        "healthd/policy.py": "X = 1\n",
        "clusterctl/slurm/nodes.py": "from clusterctl.launcher.login import submit\n",
        "launcher/login/submit.py": "import click\nfrom ... import healthd\n",
        "launcher/pure/classify.py": "import subprocess\n\ndef blame():\n    from clusterctl.healthd.policy import X\n"
                                     "    return X\n",
        "launcher/job/steps.py": "from clusterctl.launcher.login.submit import main\n",
        "launcher/job/agent.py": 'ARGV = ["python", "-m", "clusterctl.launcher.login.cli"]\n',
    })

    assert sorted(violations(tmp_path)) == sorted([
        "clusterctl/slurm/nodes.py:1: clusterctl.slurm.nodes (core) imports clusterctl.launcher.login.submit "
        "(launcher.login); core may import only ['core']",
        "clusterctl/launcher/job/agent.py:1: clusterctl.launcher.job.agent (launcher.job) starts "
        "clusterctl.launcher.login.cli (launcher.login); launcher.job may start only "
        "['core', 'launcher.job', 'launcher.pure', 'launcher.shared']",
        "clusterctl/launcher/job/steps.py:1: clusterctl.launcher.job.steps (launcher.job) imports "
        "clusterctl.launcher.login.submit (launcher.login); launcher.job may import only "
        "['core', 'launcher.job', 'launcher.pure', 'launcher.shared']",
        "clusterctl/launcher/login/submit.py:1: clusterctl.launcher.login.submit imports click; click and rich "
        "belong in a cli.py or a *_view.py module",
        "clusterctl/launcher/login/submit.py:2: clusterctl.launcher.login.submit (launcher.login) imports "
        "clusterctl.healthd (healthd); launcher.login may import only "
        "['core', 'launcher.login', 'launcher.pure', 'launcher.shared']",
        "clusterctl/launcher/pure/classify.py:1: clusterctl.launcher.pure.classify (launcher.pure) imports subprocess; "
        "pure judgement has no side effects: put the effect in launcher.shared, job or login and pass it in",
        "clusterctl/launcher/pure/classify.py:4: clusterctl.launcher.pure.classify (launcher.pure) imports "
        "clusterctl.healthd.policy (healthd); launcher.pure may import only ['core', 'launcher.pure']",
    ])
    assert reachable(tmp_path, "launcher.pure", "healthd") == ["clusterctl.launcher.pure.classify",
                                                               "clusterctl.healthd.policy"]
    assert reachable(tmp_path, "launcher.job", "launcher.login") == ["clusterctl.launcher.job.steps",
                                                                     "clusterctl.launcher.login.submit"]


def test_the_rules_catch_the_slurm_door_importing_a_record(tmp_path):
    _plant(tmp_path, {
        "clusterctl/slurm/drains.py": "def f():\n    from clusterctl.records.drain_reason import DrainReason\n",
        "clusterctl/slurm/nodes.py": "from clusterctl.records import healthd_state\n",
    })
    (tmp_path / "clusterctl" / "records").mkdir()
    (tmp_path / "clusterctl" / "records" / "__init__.py").write_text("")
    for name in ("drain_reason", "healthd_state"):
        (tmp_path / "clusterctl" / "records" / f"{name}.py").write_text("from clusterctl.slurm import nodes\n")

    why = ONE_WAY[("clusterctl.slurm", "clusterctl.records")]
    assert sorted(violations(tmp_path)) == [
        f"clusterctl/slurm/drains.py:2: clusterctl.slurm.drains imports clusterctl.records.drain_reason; {why}",
        f"clusterctl/slurm/nodes.py:1: clusterctl.slurm.nodes imports clusterctl.records.healthd_state; {why}",
    ]


def test_the_rules_catch_a_stale_module_name_and_a_template_running_login_code(tmp_path):
    _plant(tmp_path, {
        "launcher/job/agent.py": 'ARGV = ["python", "-m", "clusterctl.launcher.job.steps", "rank"]\n',
        "sbatch_templates/srun.sbatch": '"$python" -m clusterctl.launcher.login.cli status\n'
                                        '"$python" -m clusterctl.launcher.job plan\n',
        "launcher/login/cli.py": "",
    })

    assert unknown_module_names(tmp_path) == [
        "clusterctl/launcher/job/agent.py:1: names clusterctl.launcher.job.steps, which is no module of clusterctl",
    ]
    assert template_violations(tmp_path) == [
        "sbatch_templates/srun.sbatch:1: runs clusterctl.launcher.login.cli (launcher.login); a job script runs only "
        "['launcher.job']",
        "sbatch_templates/srun.sbatch:2: runs the package clusterctl.launcher.job, which has no __main__.py",
    ]


def test_the_rules_catch_a_cycle(tmp_path):
    _plant(tmp_path, {
        "launcher/job/steps.py": "def f():\n    from clusterctl.launcher.job import agent\n",
        "launcher/job/agent.py": "from clusterctl.launcher.job import steps\n",
    })

    assert import_cycles(tmp_path, "clusterctl.launcher") == [
        ["clusterctl.launcher.job.agent", "clusterctl.launcher.job.steps", "clusterctl.launcher.job.agent"]]


def test_the_rules_catch_a_framework_outside_the_integrations(tmp_path):
    _plant(tmp_path, {
        "clusterctl/progress.py": "import transformers\n",
        "launcher/job/steps.py": "def f():\n    from clusterctl.integrations import lightning\n",
        "clusterctl/integrations/__init__.py": "",
        "clusterctl/integrations/lightning.py": "import lightning.pytorch\n",
    })

    assert sorted(violations(tmp_path)) == [
        "clusterctl/launcher/job/steps.py:2: clusterctl.launcher.job.steps imports clusterctl.integrations.lightning; "
        "the framework callbacks are the training program's to import, never clusterctl's (their frameworks are not "
        "in the base install)",
        "clusterctl/progress.py:1: clusterctl.progress imports transformers, a training framework the base install "
        "lacks; only the callbacks in clusterctl/integrations/ import one",
    ]
