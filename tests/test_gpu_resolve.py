"""The carried wheel set (bench/gpu_wheels.py) resolves against the lent GPU machine's own
versions (issue 64 §2), before a GPU call is spent finding out: Python 3.12, torch 2.11,
transformers 5.17, huggingface_hub 1.33 and the rest its package list names
(``LENT_IMAGE_PINS``). A resolver's dry run (`uv pip compile` for CPython 3.12 on
manylinux x86-64): nothing is installed, no CUDA torch downloaded (the index's metadata
only). Two environments, as bench/gpu.sh makes them: the bench's own processes (the
carried site on PYTHONPATH over the image) and the transformers + PEFT baseline (the image
alone). What a resolve cannot see is in docs/trainer.md#gpu-performance.

Needs the package index this machine installs from (`make venv`'s, through
kubetune/tools/uv_settings.py): without one the test fails, saying so."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import REPO
from kubetune.tools.uv_settings import uv_environment

pytestmark = pytest.mark.slow  # seconds of index round trips, not a training step
# The lent image's python3 (3.12.3) on its glibc (2.39: PLATFORMS in gpu_wheels.py).
PLATFORM = "x86_64-manylinux_2_39"


def _wheels():
    spec = importlib.util.spec_from_file_location("bench_gpu_wheels",
                                                  REPO / "bench" / "gpu_wheels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def resolve(tmp_path: Path, requirements: list[str], constraints: list[str]
            ) -> subprocess.CompletedProcess:
    """`uv pip compile` of ``requirements`` under ``constraints`` for the lent machine."""
    (tmp_path / "requirements.in").write_text("\n".join(requirements) + "\n")
    (tmp_path / "constraints.txt").write_text("\n".join(constraints) + "\n")
    env = {**os.environ, **uv_environment(), "UV_PYTHON_DOWNLOADS": "never"}
    # This machine's own cap (pip's constraint file: the releases on its disk) says
    # nothing of the lent machine, whose pins are the constraints here.
    env.pop("UV_CONSTRAINT", None)
    uv = Path(sys.executable).with_name("uv")
    return subprocess.run([str(uv), "pip", "compile", "--quiet", "--no-header",
                           "--no-annotate", "--python-version", _wheels().LENT_PYTHON,
                           "--python-platform", PLATFORM, "--only-binary", ":all:",
                           "--constraint", str(tmp_path / "constraints.txt"),
                           str(tmp_path / "requirements.in")],
                          capture_output=True, text=True, env=env, timeout=600)


def pins(compiled: str) -> dict[str, str]:
    return {m.group(1).lower(): m.group(2)
            for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)", compiled, re.M)}


def _resolved(done: subprocess.CompletedProcess, what: str) -> dict[str, str]:
    unreachable = re.search(r"dns error|Failed to fetch|Could not connect", done.stderr)
    assert not unreachable, f"no package index answered the {what} resolve: " \
                            f"{done.stderr[-1500:]}"
    assert done.returncode == 0, f"the {what} does not resolve on the lent machine:\n" \
                                 f"{done.stderr[-3000:]}"
    return pins(done.stdout)


def test_the_carried_set_resolves_over_the_lent_image(tmp_path):
    wheels = _wheels()
    requirements, constraints = wheels.overlay_resolve_input()
    found = _resolved(resolve(tmp_path, requirements, constraints), "carried set")
    # the image's torch is what the training stack runs on there, not the 2.13 we pin,
    # and our stack's own versions win over the image's (install replaces them)
    assert found["torch"] == "2.11.0" and found["triton"] == "3.6.0"
    assert found["torchtune"] == "0.6.1" and found["torchao"] == "0.15.0"
    assert found["huggingface-hub"] == wheels.carried_set()["huggingface-hub"]
    # nothing the carried stack imports pulls the image's transformers in beside the
    # carried huggingface_hub 2.x (transformers 5.17 needs < 2)
    assert "transformers" not in found and "peft" not in found


def test_the_baseline_resolves_on_the_image_alone(tmp_path):
    requirements, constraints = _wheels().baseline_resolve_input()
    found = _resolved(resolve(tmp_path, requirements, constraints), "baseline")
    assert found["transformers"] == "5.17.0" and found["huggingface-hub"] == "1.33.0"
    assert found["torch"] == "2.11.0" and "peft" in found


def test_the_resolve_fails_on_the_conflict_it_guards_against(tmp_path):
    # the baseline's transformers in the bench's processes: the carried huggingface_hub
    # 2.x shadows the image's 1.33 there, and the resolve says so
    wheels = _wheels()
    requirements, constraints = wheels.overlay_resolve_input()
    done = resolve(tmp_path, [*requirements, "transformers==5.17.0"], constraints)
    assert done.returncode != 0
    assert "huggingface-hub" in done.stderr and "transformers" in done.stderr, done.stderr
