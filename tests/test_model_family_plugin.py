"""docs/extending.md's model family example (examples/model-family), installed the way an
image would: a row from outside the package makes a new ``model_type`` train, and without
it the same checkpoint is refused in one line that says where a row goes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support.cli import REPO, clean_env, error_lines, kubetune
from tests.support.example_packages import install_example
from tests.test_export_serving import serving_python  # noqa: F401 (fixture)
from tests.test_model_families import write_checkpoint

EXAMPLE = REPO / "examples" / "model-family"


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> str:
    return install_example(EXAMPLE, tmp_path_factory)


@pytest.fixture(scope="module")
def acme_checkpoint(serving_python, tmp_path_factory) -> Path:  # noqa: F811
    """A tiny Qwen3 written by transformers, renamed acme_lm: the features the row says."""
    model = write_checkpoint(serving_python, "qwen3", tmp_path_factory.mktemp("acme") / "model")
    config = json.loads((model / "config.json").read_text())
    config.update(model_type="acme_lm", architectures=["AcmeForCausalLM"])
    (model / "config.json").write_text(json.dumps(config))
    return model


def test_without_the_row_the_type_is_refused_naming_where_rows_go(acme_checkpoint):
    result = kubetune("size", "--model", str(acme_checkpoint), env=clean_env())
    assert result.returncode == 65, result.stderr[-2000:]
    [line] = error_lines(result)
    assert "model_type 'acme_lm' in config.json is not supported" in line
    assert "add one in kubetune/model_family/families.py" in line


@pytest.mark.slow
def test_a_row_installed_beside_kubetune_trains_the_new_type(plugin_path, acme_checkpoint,
                                                             tiny_dataset_dir, tmp_path):
    sized = kubetune("size", "--model", str(acme_checkpoint),
                     env=clean_env(PYTHONPATH=plugin_path))
    assert sized.returncode == 0, sized.stderr[-2000:]
    assert "(acme_lm, " in sized.stdout and "q/k norms" in sized.stdout
    output = tmp_path / "output"
    env = clean_env(PYTHONPATH=plugin_path, KUBETUNE_MODEL_DIR=str(acme_checkpoint),
                    KUBETUNE_DATASET_DIR=str(tiny_dataset_dir), KUBETUNE_OUTPUT_DIR=str(output))
    trained = kubetune("train", "--epochs", "1", "--batch-size", "8", "--max-steps", "2",
                       "--dtype", "fp32", "--method", "dora", env=env, timeout=600)
    assert trained.returncode == 0, trained.stderr[-3000:]
    merged = yaml.safe_load((output / "kubetune-config.yaml").read_text())
    assert merged["model"]["_component_"] == "kubetune.trainer.models.decoder.lora_decoder"
    assert merged["model"]["use_dora"] is True and merged["model"]["qk_norm"] == "head"
    assert json.loads((output / "summary.json").read_text())["steps"] == 2
    assert (output / "epoch_0" / "adapter_model.safetensors").is_file()
