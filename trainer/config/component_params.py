"""The parameters a config component (``_component_: a.b.name``) accepts, read from its
source with ``ast``: importing torchtune to ``inspect.signature`` a builder costs the
launcher seconds of torch import before the recipe has started.

Follows what torchtune's packages do to expose a builder: ``from .x import name``
re-exports and ``name = partial(builder, key=value)`` presets.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

NO_DEFAULT = object()


@dataclass
class ComponentParams:
    defaults: dict[str, object] = field(default_factory=dict)  # name -> default or NO_DEFAULT
    var_kwargs: bool = False  # takes **kwargs: any other key is passed on


def _package_dir(top: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return Path(spec.origin) if spec.origin else None


def _module_file(module: str) -> Path | None:
    top, *rest = module.split(".")
    root = _package_dir(top)
    if root is None:
        return None
    if root.is_file():
        return root if not rest else None
    path = root.joinpath(*rest)
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


@functools.lru_cache(maxsize=64)
def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None


def _literal(node: ast.AST | None) -> object:
    if node is None:
        return NO_DEFAULT
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def _from_function(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> ComponentParams:
    args = fn.args
    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    params = {a.arg: _literal(d) for a, d in zip(positional, defaults)}
    params.update({a.arg: _literal(d) for a, d in zip(args.kwonlyargs, args.kw_defaults)})
    params.pop("self", None)
    return ComponentParams(params, args.kwarg is not None)


def _resolve(module: str, name: str, depth: int = 0) -> ComponentParams | None:
    path = _module_file(module)
    tree = _parse(path) if path is not None and depth < 8 else None
    if tree is None:
        return None
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return _from_function(node)
        if isinstance(node, ast.ClassDef) and node.name == name:
            init = next((n for n in node.body if isinstance(n, ast.FunctionDef)
                         and n.name == "__init__"), None)
            return _from_function(init) if init is not None else None
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name
                                                for t in node.targets):
            call = node.value
            if (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "partial"
                    and call.args and isinstance(call.args[0], ast.Name)):
                inner = _resolve(module, call.args[0].id, depth + 1)
                if inner is not None:
                    for kw in call.keywords:
                        if kw.arg is not None:
                            inner.defaults[kw.arg] = _literal(kw.value)
                return inner
            return None
        if isinstance(node, ast.ImportFrom) and any(
                (alias.asname or alias.name) == name for alias in node.names):
            original = next(a.name for a in node.names if (a.asname or a.name) == name)
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            return _resolve(source, original, depth + 1)
    return None


def component_params(component: str) -> ComponentParams | None:
    """Parameters of ``component`` (a dotted path), or None where its source cannot be
    read (a compiled or dynamically built callable): then nothing is checked."""
    module, _, name = str(component).rpartition(".")
    if not module:
        return None
    return _resolve(module, name)
