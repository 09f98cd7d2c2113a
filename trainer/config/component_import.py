"""A user's ``_component_`` module (a dataset builder on PYTHONPATH, in an image FROM ours)
imported before launch, so that a module that does not import is one line with its cause
(``No module named 'acme_datasetz'``), not exit 70 and torchtune's long traceback from
inside the recipe, cut off at "Error loading ...".

The import runs in a child interpreter with this process's environment (the recipe
processes get the same PYTHONPATH): the launcher itself never imports torch, which a
builder module imports, nor keeps whatever the module does at import time.
"""

from __future__ import annotations

import os
import subprocess
import sys

from kubetune.trainer.config.component_params import SHIPPED_PACKAGES

# The child prints the exception's own last line (``ModuleNotFoundError: No module ...``).
_PROBE = ("import importlib, sys\n"
          "try:\n    importlib.import_module(sys.argv[1])\n"
          "except BaseException as exc:\n"
          "    print(f'{type(exc).__name__}: {exc}'.splitlines()[0]); sys.exit(3)\n")
TIMEOUT_S = 300


def users_module(component: str) -> str | None:
    """The module part of ``component`` where it is not one of the packages the trainer
    ships (their names are checked from source, without importing)."""
    module = str(component).rpartition(".")[0]
    if not module or module.split(".")[0] in SHIPPED_PACKAGES:
        return None
    return module


def import_problem(module: str, environ: dict[str, str] | None = None,
                   cwd: str | None = None) -> str | None:
    """Why ``module`` does not import (its exception's one line), or None when it does.
    ``environ``: the environment the recipe will have (default: this process's; a
    child's environment built here)."""
    try:
        # -P: as the recipe imports it (its PYTHONPATH, never the working directory).
        result = subprocess.run([sys.executable, "-P", "-c", _PROBE, module], capture_output=True,
                                text=True, timeout=TIMEOUT_S, cwd=cwd,
                                env=dict(os.environ if environ is None else environ))
    except subprocess.TimeoutExpired:
        return None  # slow to import is not broken: the recipe will tell
    if result.returncode == 0:
        return None
    lines = result.stdout.strip().splitlines() or result.stderr.strip().splitlines()
    return lines[-1] if lines else f"the import exited with code {result.returncode}"
