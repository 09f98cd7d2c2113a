"""docs/extending.md's storage scheme example, installed the way an image would."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from tests.support.cli import REPO, clean_env, error_lines, kubetune
from tests.support.example_packages import install_example

EXAMPLE = REPO / "examples" / "storage-plugin"


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> str:
    return install_example(EXAMPLE, tmp_path_factory)


def test_installed_plugin_adds_a_scheme_to_init_model(plugin_path, tmp_path, tiny_model_dir):
    archive = tmp_path / "tiny.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tiny_model_dir, arcname=".")
    out = tmp_path / "model"
    env = clean_env(STORAGE_URI=f"tar://{archive}", OUTPUT_PATH=str(out),
                    PYTHONPATH=plugin_path)
    result = kubetune("init-model", env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert (out / "model.safetensors").read_bytes() == \
        (tiny_model_dir / "model.safetensors").read_bytes()
    manifest = json.loads((out / ".kubetune-manifest.json").read_text())
    assert manifest["resolved_revision"].startswith("sha256:")

    # Without the plugin on the path the scheme is unknown, and the error says so.
    without = kubetune("init-model", env=clean_env(STORAGE_URI=f"tar://{archive}",
                                                   OUTPUT_PATH=str(tmp_path / "other")))
    assert without.returncode == 65
    assert "unsupported storage scheme 'tar'" in error_lines(without)[0]


def test_plugin_gets_kubetune_path_safety_for_free(plugin_path, tmp_path):
    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as tar:
        for name in ("config.json", "../escape.safetensors"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"{}"))
    env = clean_env(STORAGE_URI=f"tar://{archive}", OUTPUT_PATH=str(tmp_path / "x" / "model"),
                    PYTHONPATH=plugin_path)
    result = kubetune("init-model", env=env, timeout=120)
    assert result.returncode == 65
    assert "refusing remote file name '../escape.safetensors'" in error_lines(result)[0]
    assert not (tmp_path / "x" / "escape.safetensors").exists()
