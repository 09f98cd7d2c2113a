"""What a user's serving stack does with an export: transformers + peft load the adapter on
the base model, and its logits match the exported merged model.

peft and transformers are test-only dependencies in a venv of their own (.venv-serving,
created once and kept): peft 0.21 refuses to import beside torchao 0.15, which torchtune
needs, and a serving image has no torchtune anyway.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import REPO, kubetune
from tests.support.trained import TrainedRun, train
from tests.support.uv_settings import uv_environment

pytestmark = pytest.mark.slow

SERVING_VENV = REPO / ".venv-serving"
SERVING_PINS = ["torch==2.13.0", "transformers==5.18.0", "peft==0.21.0", "safetensors==0.8.0",
                "accelerate==1.15.0"]
# float32 end to end (the trained runs pin dtype=fp32: tests/support/trained.py); the tiny
# model's logits agree to ~1e-6 (both sides sum the same float32 products in different orders).
TOLERANCE = 1e-4


@pytest.fixture(scope="session")
def serving_python() -> Path:
    python = SERVING_VENV / "bin" / "python"
    marker = SERVING_VENV / (".installed-" + "-".join(SERVING_PINS))
    # Test files run in parallel (pytest-xdist) and several ask for it at once: one builds
    # it under the lock, the others wait and use it.
    with open(REPO / ".venv-serving.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.is_file():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(SERVING_VENV)],
                           check=True)
            installed = subprocess.run(_install_command(python), capture_output=True,
                                       text=True, timeout=1200,
                                       env={**os.environ, **uv_environment()})
            assert installed.returncode == 0, installed.stderr[-3000:]
            marker.write_text("")
    return python


def _install_command(python: Path) -> list[str]:
    """uv where `make venv` installed it (seconds; pip took minutes, and every test that
    serves waits on this), else pip."""
    uv = Path(sys.executable).with_name("uv")
    if uv.is_file():
        return [str(uv), "pip", "install", "--quiet", "--python", str(python), *SERVING_PINS]
    return [str(python), "-m", "pip", "install", "--quiet", *SERVING_PINS]


@pytest.fixture(scope="module")
def dora_run(tmp_path_factory) -> TrainedRun:
    return train(tmp_path_factory.mktemp("trained-dora"), method="dora")


@pytest.mark.parametrize("method", ["lora", "dora"])
def test_peft_applies_the_exported_adapter_like_the_merged_model(request, serving_python,
                                                                  tmp_path, method):
    # DoRA: torchtune writes q/k magnitude vectors in its own row order; PEFT would scale
    # the wrong rows (max |diff| ~1e-3 here) unless the exporter reorders them.
    trained_run = request.getfixturevalue("trained_run" if method == "lora" else "dora_run")
    # Trained in float32 whatever the CPU offers, or the tolerance below means nothing.
    assert "dtype: fp32" in (trained_run.output_dir / "kubetune-config.yaml").read_text()
    dest = tmp_path / "export"
    result = kubetune("export", "--export-uri", str(dest), "--export-format", "both",
                      env=trained_run.env())
    assert result.returncode == 0, result.stderr[-3000:]
    served = subprocess.run([str(serving_python), str(REPO / "tests/support/serve_adapter.py"),
                             str(dest)], capture_output=True, text=True, timeout=600,
                            env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                                 "HOME": str(tmp_path)})
    assert served.returncode == 0, served.stderr[-3000:]
    report = json.loads(served.stdout.strip().splitlines()[-1])
    print(f"{method}: peft vs merged: {report}")
    assert report["base_model"] == str(trained_run.base_source.resolve())
    assert report["tokens"] > 10
    assert report["max_abs_diff"] <= TOLERANCE * max(1.0, report["logit_scale"])
    assert report["adapter_effect"] > 100 * TOLERANCE
    config = json.loads((dest / "adapter" / "adapter_config.json").read_text())
    assert config.get("use_dora", False) is (method == "dora")
