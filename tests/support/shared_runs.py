"""A run built once per `make test` session, shared by every xdist worker.

`pytest -n 2 --dist loadfile` gives each worker its own session, so a session fixture is
built once per worker: a run several files read (the exporter's tests read one LoRA run)
trained twice. Here the run's directory lives under the session's common tmp root (the
workers' basetemps' parent), named by what defines the run; the first test that needs it
builds it under an `fcntl` lock, the other waits on the lock and reuses it. A build that
failed leaves no `.done` marker, so the next one builds afresh (and fails alike, with its
own message). Consumers only read the run; a test that changes it works on a copy.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


# The session's TempPathFactory (conftest's autouse fixture records it): for helpers that
# no fixture reaches, such as test_model_families.write_checkpoint.
_FACTORY: list[pytest.TempPathFactory] = []


def record_factory(tmp_path_factory: pytest.TempPathFactory) -> None:
    _FACTORY[:] = [tmp_path_factory]


def session_factory() -> pytest.TempPathFactory | None:
    """The recorded factory; None outside a pytest session (e.g. a matrix worker)."""
    return _FACTORY[0] if _FACTORY else None


def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tmp directory all workers of this session share (the basetemp without xdist)."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    return root / "shared-runs"


def shared_run(tmp_path_factory: pytest.TempPathFactory, key: str,
               build: Callable[[Path], None]) -> Path:
    """The directory ``build`` filled for ``key``: built by the first caller of the
    session, reused by the others (across xdist workers too)."""
    root = shared_root(tmp_path_factory)
    root.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", key)
    workdir, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or its process dies
        if not done.exists():
            shutil.rmtree(workdir, ignore_errors=True)  # a failed build's remains
            workdir.mkdir()
            build(workdir)
            done.touch()
    return workdir
