"""One import root: the wheel installs `kubetune` and nothing else beside it, and the
product's imports name no old top-level package and form no cycle."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[1]
ROOT = "kubetune"
# Before issue 16 each of these folders was a top-level import name of its own.
OLD_ROOTS = ("entrypoints", "initializers", "trainer", "exporter")


def package_dirs() -> dict[str, Path]:
    """Package name -> folder, as pyproject.toml maps them (the core is `kubetune/`)."""
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {ROOT: REPO / ROOT, **{name: REPO / folder
                                  for name, folder in setuptools["package-dir"].items()}}


def product_modules() -> dict[str, Path]:
    """Every module the wheel should ship: dotted name -> source file."""
    modules = {}
    for package, folder in package_dirs().items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder)
            if "__pycache__" in rel.parts or any(
                    not (folder.joinpath(*rel.parts[:i]) / "__init__.py").is_file()
                    for i in range(len(rel.parts))):
                continue  # not inside a package: not shipped, not importable
            parts = rel.with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join((package, *parts))
            if name not in modules:  # `kubetune/` does not contain the mapped folders
                modules[name] = path
    return modules


def build_wheel(tmp_path: Path) -> zipfile.ZipFile:
    """Build as the Dockerfiles do: pyproject, README and the package folders only."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for folder in {p.relative_to(REPO).parts[0] for p in package_dirs().values()}:
        shutil.copytree(REPO / folder, src / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path / "wheels"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "--wheel-dir", str(out), str(src)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = out.glob("kubetune-*.whl")
    return zipfile.ZipFile(wheel)


def test_wheel_adds_one_top_level_import_name_and_ships_every_module(tmp_path):
    with build_wheel(tmp_path) as wheel:
        names = wheel.namelist()
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        top_level = wheel.read(f"{dist_info}/top_level.txt").decode().split()
        entry_points = wheel.read(f"{dist_info}/entry_points.txt").decode()
    assert top_level == [ROOT]
    assert {n.split("/")[0] for n in names if not n.startswith(dist_info)} == {ROOT}
    shipped = {n for n in names if n.endswith(".py")}
    expected = {name.replace(".", "/") + ("/__init__.py" if path.name == "__init__.py"
                                          else ".py")
                for name, path in product_modules().items()}
    missing = sorted(expected - shipped)
    assert not missing, (f"not in the wheel (a package folder missing from "
                         f"[tool.setuptools] packages in pyproject.toml?): {missing}")
    # The console script and the storage schemes load from the one root.
    targets = re.findall(r"^\w[\w-]* = ([\w.]+):\w+$", entry_points, re.M)
    assert len(targets) >= 4, entry_points
    for module in targets:
        assert module.replace(".", "/") + ".py" in shipped, module


def imports(path: Path, module: str, modules: dict[str, Path], *, at_import_time: bool
            ) -> set[str]:
    """Product modules `module` imports; only those run on import if at_import_time."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def target(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    def visit(node: ast.AST) -> None:
        if at_import_time and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                ast.Lambda)):
            return
        if at_import_time and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(
                node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(filter(None, (target(a.name) for a in node.names)))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"  # `from package import module`
                hit = full if full in modules else target(base)
                if hit:
                    found.add(hit)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(module)
    return found


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def import_graph(*, at_import_time: bool) -> dict[str, set[str]]:
    modules = product_modules()
    return {name: imports(path, name, modules, at_import_time=at_import_time)
            for name, path in modules.items()}


def test_product_has_no_import_cycle_at_import_time():
    assert cycles(import_graph(at_import_time=True)) == []


def test_product_has_no_import_cycle_through_lazy_imports_either():
    assert cycles(import_graph(at_import_time=False)) == []


def test_product_modules_resolve_under_the_root():
    modules = product_modules()
    assert {n.split(".")[0] for n in modules} == {ROOT}
    # The mapping holds the layout the design fixes: the step folders stay top-level.
    assert {n: p.relative_to(REPO).as_posix() for n, p in package_dirs().items()} == \
        {ROOT: ROOT, **{f"{ROOT}.{old}": old for old in OLD_ROOTS}}
    for name in ("kubetune.entrypoints.cli", "kubetune.initializers.storage_uri",
                 "kubetune.trainer.config.plan", "kubetune.exporter.export"):
        assert name in modules, name


def old_root_children() -> dict[str, set[str]]:
    """Old root -> the modules and packages in its folder (what an old name could name)."""
    return {old: {p.stem for p in (REPO / old).iterdir()
                  if p.suffix == ".py" or (p / "__init__.py").is_file()}
            for old in OLD_ROOTS}


def old_names(source: str, children: dict[str, set[str]]) -> list[str]:
    """Imports of an old top-level name, and strings naming one of our modules by it."""
    tree = ast.parse(source)
    dotted = re.compile(rf"(?<![\w./-])({'|'.join(OLD_ROOTS)})\.(\w+)")
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names
                      if a.name.split(".")[0] in OLD_ROOTS]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module \
                and node.module.split(".")[0] in OLD_ROOTS:
            found.append(f"from {node.module} import")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [f"string {m.group(0)}" for m in dotted.finditer(node.value)
                      if m.group(2) in children[m.group(1)]]
        elif isinstance(node, ast.List | ast.Tuple):  # argv: "-m", "entrypoints"
            values = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            found += [f"-m {value}" for flag, value in zip(values, values[1:])
                      if flag == "-m" and value in OLD_ROOTS]
    return sorted(found)


def test_nothing_imports_or_names_an_old_top_level_package():
    children = old_root_children()
    sources = set(product_modules().values())
    for folder in ("tests", "bench", "examples", "runtimes"):
        sources.update(p for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)
    found = [f"{path.relative_to(REPO)}: {hit}" for path in sorted(sources)
             for hit in old_names(path.read_text(), children)]
    assert found == []


def test_old_names_are_found():
    # The check above, on code that still uses the old names (so it can fail), and on
    # names that only look like ours. Built from OLD_ROOTS so this file names none itself.
    e, _, t, x = OLD_ROOTS
    sample = (f"from {t}.plan import Plan\nimport {x}.verify\n"
              f"ARGV = ['-m', '{e}', 'init-model']\n"
              f"COMPONENT = '{t}.schedules.linear_schedule_with_warmup'\n"
              f"NOT_OURS = ['{t}.kubeflow.org/framework', '{t}', 'spec.{t}.args',\n"
              f"            '{t}.numNodes must be 1', 'kubetune.{t}.plan']\n")
    assert old_names(sample, old_root_children()) == [
        f"-m {e}", f"from {t}.plan import", f"import {x}.verify", f"string {t}.schedules"]


def test_exporter_imports_no_trainer_or_initializer_module():
    # The exporter reads what the trainer and the initializers leave through the workspace
    # contract (kubetune.workspace) and shares model-family knowledge with the trainer
    # through kubetune.model_family; any import of their modules, lazy ones included, fails.
    graph = import_graph(at_import_time=False)
    found = sorted(f"{name} -> {dep}" for name, deps in graph.items()
                   if name.startswith("kubetune.exporter") for dep in deps
                   if dep.startswith(("kubetune.trainer", "kubetune.initializers")))
    assert found == []


def test_the_contract_and_model_families_sit_below_every_step():
    graph = import_graph(at_import_time=False)
    steps = tuple(f"{ROOT}.{old}" for old in OLD_ROOTS)
    found = sorted(f"{name} -> {dep}" for name, deps in graph.items()
                   if name.startswith(("kubetune.workspace", "kubetune.model_family"))
                   for dep in deps if dep.startswith(steps))
    assert found == []


def contract_names() -> set[str]:
    """The file names of the workspace contract: the values of its *_NAME / *_PREFIX."""
    tree = ast.parse((REPO / ROOT / "workspace" / "__init__.py").read_text())
    return {node.value.value for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            and any(isinstance(t, ast.Name) and t.id.endswith(("_NAME", "_PREFIX"))
                    for t in node.targets)}


# File names that are Hugging Face's or PEFT's before they are ours: a model directory's
# own files, checked where models are made (demo) and verified (initializers) too.
FOREIGN_NAMES = {"config.json", "model.safetensors.index.json", "adapter_model.safetensors",
                 "adapter_config.json", "manifest.json"}


def contract_literals(source: str, names: set[str]) -> list[str]:
    """String constants that are exactly a contract name (docstrings aside): a path built
    from one, not a sentence that mentions it."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return sorted(f"{node.lineno}: {node.value!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and node.value in names and id(node) not in docstrings)


def test_workspace_file_names_are_written_only_in_the_contract():
    names = contract_names() - FOREIGN_NAMES
    assert {"summary.json", "kubetune-complete.json", ".kubetune-manifest.json"} <= names
    contract = REPO / ROOT / "workspace" / "__init__.py"
    found = [f"{path.relative_to(REPO)}:{hit}" for path in sorted(product_modules().values())
             if path != contract for hit in contract_literals(path.read_text(), names)]
    assert found == []


def test_contract_literals_are_found():
    sample = ('"""Writes summary.json."""\n'
              'SUMMARY = "summary.json"\n'
              'def f(d):\n    """summary.json"""\n    return d / "kubetune-complete.json"\n'
              'NOTE = "see summary.json for the numbers"\n')
    assert contract_literals(sample, contract_names()) == [
        "2: 'summary.json'", "5: 'kubetune-complete.json'"]


def test_the_core_and_the_steps_import_nothing_from_tools():
    # kubetune/ is the core every step shares; what runs outside a pod (the emulator, the
    # demo) sits in kubetune.tools. A step or core module importing it would put the
    # emulator in every image; only the CLI (entrypoints) may reach it.
    graph = import_graph(at_import_time=False)
    found = sorted(f"{name} -> {dep}" for name, deps in graph.items()
                   if not name.startswith(("kubetune.tools", "kubetune.entrypoints"))
                   for dep in deps if dep.startswith("kubetune.tools"))
    assert found == []


def test_the_trainer_is_grouped_in_rooms():
    # Issue 24: the trainer's modules sit in sub-packages by concern; only the flow
    # (launch) and the stable `_component_` paths (schedules, models/) stay at its top.
    top = sorted(p.stem for p in (REPO / "trainer").glob("*.py") if p.stem != "__init__")
    assert top == ["launch", "schedules"]


# The packages whose __init__ docstring is the map a newcomer reads: each must name every
# module (and sub-package) it holds.
MAPPED = ("trainer", "initializers", "initializers/sources", "exporter", "kubetune/remote")


@pytest.mark.parametrize("folder", MAPPED)
def test_every_package_map_names_all_its_modules(folder):
    packages = [REPO / folder]
    if folder == "trainer":
        packages = [p for p in (REPO / "trainer").iterdir() if (p / "__init__.py").is_file()]
    for package in packages:
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        names = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
        names |= {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
        missing = sorted(n for n in names if not re.search(rf"\b{n}\b", doc))
        assert missing == [], f"{package.relative_to(REPO)}/__init__.py's map does not name {missing}"


def room_of(module: str, modules: dict[str, Path]) -> str:
    """A module's room: its package; the root's own modules are each a room (the core is a
    floor of single modules that every step shares)."""
    room = module if modules[module].name == "__init__.py" else module.rpartition(".")[0]
    return module if room == ROOT else room


def test_no_arrow_runs_back_up_between_rooms():
    # Issue 35: rooms form layers. A room importing one that imports it back (directly or
    # round a loop) means a module sits in the wrong room. A package and its own
    # sub-package count as one suite (a plugin API spans both).
    modules = product_modules()
    graph: dict[str, set[str]] = {}
    why: dict[tuple[str, str], str] = {}
    for name, deps in import_graph(at_import_time=False).items():
        for dep in deps:
            a, b = room_of(name, modules), room_of(dep, modules)
            if a == b or a.startswith(b + ".") or b.startswith(a + "."):
                continue
            graph.setdefault(a, set()).add(b)
            why.setdefault((a, b), f"{name} -> {dep}")
    found = [sorted(why[(a, b)] for a in loop for b in loop if (a, b) in why)
             for loop in cycles(graph)]
    assert found == []
