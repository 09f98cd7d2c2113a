"""Which optional dependencies (`pip install kubetune[<extra>]`) a command needs, checked
before the command imports them.

Every image ships the whole CLI, but not every stack: the initializer image has the core
dependencies only. So `--help` of every command works everywhere (the command modules
import the torch stack inside their bodies, never at import time), and a command run in an
image without its stack ends in one `error:` line that names the image and the extra, not
in a ModuleNotFoundError traceback.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re

from kubetune.errors import BadInputError

# extra -> the image that ships it (docs/images.md)
IMAGES = {"train": "the trainer image (or the all-in-one image)",
          "export": "the exporter image (or the trainer or all-in-one image)",
          "all": "the all-in-one image"}
# `name[extras]==1.0; extra == "train"`, as importlib.metadata lists our requirements
_EXTRA_REQUIREMENT = re.compile(
    r"""^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?.*;.*\bextra\s*==\s*["']([\w-]+)["']""")


def extra_modules(extra: str) -> list[str]:
    """The top-level modules of the distributions the extra adds (pyproject.toml's list,
    read from our installed metadata: one list to keep pinned)."""
    names: list[str] = []
    for requirement in importlib.metadata.requires("kubetune") or []:
        match = _EXTRA_REQUIREMENT.match(requirement)
        if not match or match.group(3) != extra:
            continue
        if match.group(1).lower() == "kubetune":  # `all` = kubetune[train,export]
            for inner in (match.group(2) or "").split(","):
                names += [n for n in extra_modules(inner.strip()) if n not in names]
        elif (name := match.group(1).lower().replace("-", "_")) not in names:
            # Every distribution of our extras imports under its own name.
            names.append(name)
    return names


def missing(extra: str) -> list[str]:
    return [name for name in extra_modules(extra) if importlib.util.find_spec(name) is None]


def require(extra: str, command: str) -> None:
    """Raise one actionable line (exit 65: a restart cannot install a package) when the
    extra ``command`` needs is not installed in this image."""
    absent = missing(extra)
    if absent:
        named = ", ".join(absent[:3]) + (f" and {len(absent) - 3} more" if len(absent) > 3
                                         else "")
        raise BadInputError(f"{command} needs {IMAGES[extra]} / `pip install kubetune[{extra}]` "
                            f"({named} not installed here)")
