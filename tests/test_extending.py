"""docs/extending.md's examples, each run the way a runtime author would use it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.cli import clean_env, kubetune, tune
from tests.support.dockerfile import parse

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


@pytest.mark.slow
def test_custom_dataset_builder_through_dataset_component(tmp_path, tiny_model_dir,
                                                          tiny_dataset_dir):
    env = clean_env(PYTHONPATH=f"{EXAMPLES / 'custom-dataset'}:{REPO}")
    out = tmp_path / "output"
    result = tune("run", "lora_finetune_single_device", "--config",
                  "llama3_2/1B_lora_single_device",
                  "dataset._component_=my_datasets.arithmetic_chat_dataset",
                  "dataset.source=parquet",
                  f"dataset.data_files={tiny_dataset_dir / 'data' / 'train.parquet'}",
                  f"checkpointer.checkpoint_dir={tiny_model_dir}", f"output_dir={out}",
                  f"tokenizer.path={tiny_model_dir / 'original' / 'tokenizer.model'}",
                  "epochs=1", "max_steps_per_epoch=2", "batch_size=8", "seed=0", env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "arithmetic_chat_dataset: 512 conversations" in result.stdout + result.stderr
    merged = yaml.safe_load((out / "kubetune-config.yaml").read_text())
    assert merged["dataset"]["_component_"] == "my_datasets.arithmetic_chat_dataset"
    assert json.loads((out / "summary.json").read_text())["steps"] == 2


@pytest.mark.slow
def test_runtime_wrapping_the_exporter(tmp_path, tiny_model_dir, tiny_dataset_dir):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": "wrapped"},
        "spec": {"runtimeRef": {"name": "my-org-lora-gated-export"},
                 "initializer": {"model": {"storageUri": f"file://{tiny_model_dir}"},
                                 "dataset": {"storageUri": f"file://{tiny_dataset_dir}"}},
                 "trainer": {"env": [{"name": "KUBETUNE_MAX_STEPS", "value": "2"},
                                     {"name": "KUBETUNE_EPOCHS", "value": "1"}]}}}))
    result = kubetune("local", "--workdir", str(tmp_path / "run"), "--runtime",
                      str(EXAMPLES / "wrapped-step" / "runtime.yaml"), "--trainjob", str(job),
                      env=clean_env())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    ws = tmp_path / "run" / "workspace"
    record = json.loads((ws / "registry" / "record.json").read_text())
    manifest = json.loads((ws / "export" / "manifest.json").read_text())
    assert record["files"] == {f["path"]: f["sha256"] for f in manifest["files"]}
    assert "adapter_model.safetensors" in record["files"]


def test_image_from_ours_adding_a_storage_scheme():
    dockerfile = EXAMPLES / "custom-image" / "Dockerfile"
    lint = subprocess.run([str(Path(sys.executable).parent / "hadolint"), "--no-color",
                           str(dockerfile)], capture_output=True, text=True, timeout=120)
    assert lint.returncode == 0, lint.stdout
    df = parse(dockerfile)
    assert df.expand(df.final.base).startswith("ghcr.io/kubetune/initializer:")
    assert df.final.all("USER")[-1] == "65532:65532"  # back to our non-root user
    assert any("examples/storage-plugin" in c for c in df.final.all("COPY"))
