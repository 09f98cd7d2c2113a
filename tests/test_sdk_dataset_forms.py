"""Every dataset form a Kubeflow SDK user can submit runs end to end, offline, through
`kubetune local --runtime runtimes/overlays/dropin/torchtune-llama3.2-1b.yaml`, from the files the
dataset initializer wrote, whatever the recipe config's `source` names (a hub repo the
trainer never reaches). The TrainJob is built by the SDK itself (kubeflow 0.5.0)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kubetune.tools.demo import write_tiny_alpaca_dataset, write_tiny_dataset
from tests.support.cli import clean_env, kubetune
from tests.support.runtimes import runtime_file
from tests.support.sdk_trainjob import sdk_trainjob_spec, use_local_sources

pytestmark = pytest.mark.filterwarnings("ignore:Support for class-based `config`")

REPO = Path(__file__).resolve().parents[1]
RUNTIME = runtime_file("torchtune-llama3.2-1b")
STEPS = 2  # the runtime accepts extra trainer args: a few steps prove the path


@pytest.fixture(scope="module")
def alpaca_dir(tmp_path_factory) -> Path:
    return write_tiny_alpaca_dataset(tmp_path_factory.mktemp("sources") / "tiny-alpaca",
                                     rows=64)


@pytest.fixture(scope="module")
def qa_dir(tmp_path_factory) -> Path:
    return write_tiny_dataset(tmp_path_factory.mktemp("sources") / "tiny-qa", rows=64,
                              columns=("question", "answer"))


def _instruct(**kwargs):
    from kubeflow.trainer.types.types import TorchTuneInstructDataset

    return TorchTuneInstructDataset(**kwargs)


def _run(tmp_path: Path, spec: dict) -> tuple:
    spec["trainer"]["args"] = [*spec["trainer"].get("args", []), f"max_steps_per_epoch={STEPS}"]
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": "sdk-form"},
        "spec": {"runtimeRef": {"name": "torchtune-llama3.2-1b"}, **spec}}))
    result = kubetune("local", "--workdir", str(tmp_path / "run"), "--runtime",
                      str(RUNTIME), "--trainjob", str(job), env=clean_env())
    ws = tmp_path / "run" / "workspace"
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    merged = yaml.safe_load((ws / "output" / "kubetune-config.yaml").read_text())
    summary = json.loads((ws / "output" / "summary.json").read_text())
    assert summary["steps"] == STEPS
    assert (ws / "export" / "adapter_model.safetensors").is_file()
    return result, merged, ws


def _said(result, text: str) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines() if text in line]


@pytest.mark.slow
def test_sdk_default_dataset_reads_the_workspace_not_the_configs_hub_repo(
        tmp_path, tiny_model_dir, alpaca_dir):
    """No dataset_preprocess_config: the SDK sends only dataset.data_dir and the recipe
    config keeps alpaca_cleaned_dataset, whose source is the hub repo yahma/alpaca-cleaned."""
    spec = sdk_trainjob_spec(RUNTIME, dataset_uri="hf://kubetune/tiny-alpaca/data",
                             dataset_preprocess_config=None, batch_size=4)
    assert "dataset.data_dir=/workspace/dataset/data" in spec["trainer"]["args"]
    result, merged, ws = _run(tmp_path, use_local_sources(spec, tiny_model_dir, alpaca_dir))
    assert merged["dataset"]["_component_"] == "torchtune.datasets.alpaca_cleaned_dataset"
    assert merged["dataset"]["source"] == "parquet"
    assert merged["dataset"]["data_dir"] == str(ws / "dataset" / "data")
    assert len(_said(result, "instead of dataset.source=yahma/alpaca-cleaned")) == 1


@pytest.mark.slow
def test_sdk_instruct_dataset_without_source_reads_the_file_the_sdk_names(
        tmp_path, tiny_model_dir, tiny_dataset_dir):
    """TorchTuneInstructDataset() has no source (instruct_dataset requires one); a URI to
    one file makes the SDK send dataset.data_files."""
    spec = sdk_trainjob_spec(RUNTIME, dataset_uri="hf://kubetune/tiny-addition/data/train.parquet",
                             dataset_preprocess_config=_instruct(), batch_size=4)
    assert "dataset.data_files=/workspace/dataset/data/train.parquet" in spec["trainer"]["args"]
    result, merged, ws = _run(tmp_path, use_local_sources(spec, tiny_model_dir, tiny_dataset_dir))
    assert merged["dataset"]["source"] == "parquet"
    assert merged["dataset"]["data_files"] == str(ws / "dataset" / "data" / "train.parquet")
    assert len(_said(result, "the config names no dataset.source")) == 1


@pytest.mark.slow
def test_sdk_instruct_dataset_with_column_map(tmp_path, tiny_model_dir, qa_dir):
    spec = sdk_trainjob_spec(RUNTIME, dataset_uri="hf://kubetune/tiny-qa",
                             dataset_preprocess_config=_instruct(
                                 column_map={"input": "question", "output": "answer"}),
                             batch_size=4)
    assert "dataset.data_dir=/workspace/dataset/." in spec["trainer"]["args"]
    result, merged, ws = _run(tmp_path, use_local_sources(spec, tiny_model_dir, qa_dir))
    assert merged["dataset"]["column_map"] == {"input": "question", "output": "answer"}
    assert merged["dataset"]["data_dir"] == str(ws / "dataset")
    assert merged["dataset"]["source"] == "parquet"


@pytest.mark.slow
def test_example_trainjob_with_the_alpaca_dataset_override(tmp_path, tiny_model_dir, alpaca_dir):
    """examples/trainjobs/llama3.2-1b-lora-sdk.yaml (dataset=alpaca_dataset, whose source
    is tatsu-lab/alpaca), with the tiny model and data as its sources."""
    example = yaml.safe_load((REPO / "examples" / "trainjobs" / "llama3.2-1b-lora-sdk.yaml")
                             .read_text())
    spec = example["spec"]
    del spec["runtimeRef"]
    spec["initializer"]["model"].pop("secretRef")
    assert "dataset=torchtune.datasets.alpaca_dataset" in spec["trainer"]["args"]
    result, merged, ws = _run(tmp_path, use_local_sources(spec, tiny_model_dir, alpaca_dir))
    assert merged["dataset"]["_component_"] == "torchtune.datasets.alpaca_dataset"
    assert merged["dataset"]["source"] == "parquet"
    assert len(_said(result, "instead of dataset.source=tatsu-lab/alpaca")) == 1
