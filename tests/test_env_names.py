"""Every environment variable name lives in kubetune/env.py: a product module that reads,
sets or declares one by its literal spelling fails here, naming the file and line."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support.cli import REPO

PRODUCT_FOLDERS = ("kubetune", "entrypoints", "trainer", "initializers", "exporter")
ENV_MODULE = Path("kubetune/env.py")

# Names that hold a process environment (os.environ, or a dict built to become one).
_ENVIRON_NAMES = {"environ", "env", "child_env", "child", "environment"}
_ENV_CONSTANT = re.compile(r"^ENV_|_ENV$")


def _is_environ(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "environ"
    return isinstance(node, ast.Name) and node.id in _ENVIRON_NAMES


def _text(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _strings(node: ast.AST) -> list[ast.Constant]:
    return [n for n in ast.walk(node) if _text(n) is not None]


def literal_env_names(source: str) -> list[tuple[int, str]]:
    """(line, name) of each variable name spelled as a literal where an environment is read,
    set or declared: ``os.environ[...]``, ``.get``/``setdefault``/``pop`` on an environment,
    ``os.getenv``, ``"X" in os.environ``, ``envvar=``, keys of a dict spread from an
    environment, a Kubernetes env entry, an ``ENV_*``/``*_ENV`` constant."""
    found: list[tuple[int, str]] = []

    def hit(node: ast.AST | None) -> None:
        if _text(node) is not None:
            found.append((node.lineno, _text(node)))

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and _is_environ(node.value):
            hit(node.slice)
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and node.args and (
                    (func.attr in ("get", "setdefault", "pop") and _is_environ(func.value))
                    or func.attr in ("getenv", "putenv", "unsetenv")):
                hit(node.args[0])
            elif isinstance(func, ast.Name) and func.id == "getenv" and node.args:
                hit(node.args[0])
            for keyword in node.keywords:
                if keyword.arg == "envvar":
                    for constant in _strings(keyword.value):
                        hit(constant)
        elif isinstance(node, ast.Compare) and any(
                isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and any(
                _is_environ(c) for c in node.comparators):
            hit(node.left)
        elif isinstance(node, ast.Dict):
            keys = {_text(k): v for k, v in zip(node.keys, node.values) if _text(k)}
            if any(k is None and _is_environ(v) for k, v in zip(node.keys, node.values)):
                for key in node.keys:
                    hit(key)
            elif "name" in keys and ("value" in keys or "valueFrom" in keys):
                hit(keys["name"])
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and _ENV_CONSTANT.search(t.id) for t in targets):
                value = node.value
                for constant in _strings(ast.Tuple(elts=value.keys, ctx=ast.Load())
                                         if isinstance(value, ast.Dict) else value):
                    hit(constant)
    return sorted(set(found))


def _product_files() -> list[Path]:
    return sorted(p.relative_to(REPO) for folder in PRODUCT_FOLDERS
                  for p in (REPO / folder).rglob("*.py"))


def test_no_product_module_spells_an_env_var_name_outside_env_py():
    files = [p for p in _product_files() if p != ENV_MODULE]
    assert len(files) > 50  # the walk found the product, not an empty folder
    offenders = [f"{path}:{line}: {name!r}" for path in files
                 for line, name in literal_env_names((REPO / path).read_text())]
    assert not offenders, ("spell these as kubetune.env constants (add the name to "
                           "kubetune/env.py):\n" + "\n".join(offenders))


PLANTED = [
    ('import os\nos.environ["KUBETUNE_X"]\n', "KUBETUNE_X"),
    ('import os\nos.environ.get("KUBETUNE_X", "1")\n', "KUBETUNE_X"),
    ('import os\nos.getenv("KUBETUNE_X")\n', "KUBETUNE_X"),
    ('def f(environ):\n    return environ.get("RANK")\n', "RANK"),
    ('env = {}\nenv["PATH"] = "/bin"\n', "PATH"),
    ('env = {}\nenv.setdefault("PATH", "/bin")\n', "PATH"),
    ('import os\nok = "OMP_NUM_THREADS" not in os.environ\n', "OMP_NUM_THREADS"),
    ('import click\nclick.option("--x", envvar="KUBETUNE_X")\n', "KUBETUNE_X"),
    ('import os\nchild = {**os.environ, "PYTHONUNBUFFERED": "1"}\n', "PYTHONUNBUFFERED"),
    ('entry = {"name": "PET_NNODES", "value": "2"}\n', "PET_NNODES"),
    ('ENV_INTERVAL = "KUBETUNE_PROGRESS_INTERVAL_S"\n', "KUBETUNE_PROGRESS_INTERVAL_S"),
    ('OFFLINE_ENV = {"HF_HUB_OFFLINE": "1"}\n', "HF_HUB_OFFLINE"),
    ('PET_ENV = ("PET_NNODES", "PET_NODE_RANK")\n', "PET_NODE_RANK"),
]


@pytest.mark.parametrize("source, name", PLANTED, ids=[p[1] + str(i) for i, p in
                                                       enumerate(PLANTED)])
def test_the_scan_finds_a_planted_literal(source, name):
    assert name in [found for _, found in literal_env_names(source)]


def test_the_scan_passes_the_same_code_spelled_with_constants():
    source = ('import os\nfrom kubetune import env\n'
              'os.environ.get(env.RANK, "0")\nos.environ[env.LOCAL_RANK]\n'
              'child = {**os.environ, env.PYTHONUNBUFFERED: "1"}\n'
              'entry = {"name": env.PET_NNODES, "value": "2"}\n'
              'PET_ENV = (env.PET_NNODES,)\nlabels = {"name": "x"}\n')
    assert literal_env_names(source) == []
