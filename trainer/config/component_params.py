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
    return _mapped_module_file(module) if top == "kubetune" else None


def _mapped_module_file(module: str) -> Path | None:
    """Our packages outside kubetune/ (kubetune.trainer is trainer/: setuptools'
    package-dir), found by the import system (which imports the parent packages only)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    return Path(origin) if origin and origin.endswith(".py") else None


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


SHIPPED_PACKAGES = ("torch", "torchtune", "torchao", "kubetune")


def _near(name: str, known: tuple[str, ...]) -> bool:
    """One edit (or a case change) from a known name, not the name itself."""
    def distance_one(a: str, b: str) -> bool:
        if abs(len(a) - len(b)) > 1:
            return False
        if len(a) == len(b):
            diffs = [i for i in range(len(a)) if a[i] != b[i]]
            return len(diffs) == 1 or (len(diffs) == 2 and a[diffs[0]] == b[diffs[1]]
                                       and a[diffs[1]] == b[diffs[0]])
        short, long_ = sorted((a, b), key=len)
        return any(long_[:i] + long_[i + 1:] == short for i in range(len(long_)))
    return any(name != k and (name.lower() == k or distance_one(name.lower(), k))
               for k in known)


def _defined_names(tree: ast.Module) -> set[str] | None:
    """Names a module's top level binds; None where it may bind more than ``ast`` shows
    (``from x import *``, a module ``__getattr__``, assignments into ``globals()``)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == "__getattr__":
                return None
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For)):
            return None  # conditional definitions: not followed
    return names


def missing_component(component: str) -> tuple[str, set[str]] | None:
    """Why the dotted path ``component`` surely names no callable, with the names its
    module does define (for a suggestion); None when it does, or when that cannot be
    told from the source (a compiled module, dynamic exports)."""
    module, _, name = str(component).rpartition(".")
    if not module or not name:
        return "it is not a dotted path module.name", set()
    top = module.split(".")[0]
    if _package_dir(top) is None:
        # An optional package (bitsandbytes on a CPU image) may be missing where the plan
        # is made: only a near-miss of a package the trainer ships is surely a typo.
        return (f"no module {top} is installed", set(SHIPPED_PACKAGES)) \
            if _near(top, SHIPPED_PACKAGES) else None
    path = _module_file(module)
    if path is None:
        # torchtune imports the module part: it must be a file or package on disk.
        parent, _, leaf = module.rpartition(".")
        parent_path = _module_file(parent) if parent else None
        if parent_path is None or parent_path.name != "__init__.py":
            return None
        entries = {p.name.split(".")[0] for p in parent_path.parent.iterdir()}
        if leaf in entries:
            return None  # a compiled module, a namespace package: not read here
        return f"there is no module {module}", {e for e in entries if not e.startswith("_")}
    if path.suffix != ".py" or _parse(path) is None:
        return None
    defined = _defined_names(_parse(path))
    if defined is None or name in defined:
        if path.name == "__init__.py" and (path.parent / f"{name}.py").is_file() \
                and defined is not None and name not in defined:
            return f"{component} is a module, not a class or function", set()
        return None
    if (path.parent / f"{name}.py").is_file() and path.name == "__init__.py":
        return (f"{component} is a module, not a class or function",
                {n for n in defined if not n.startswith("_")})
    return f"{module} defines no {name}", {n for n in defined if not n.startswith("_")}
