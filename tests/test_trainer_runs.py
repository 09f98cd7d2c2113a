"""`tune run` as Kubeflow Trainer sends it, on tiny Llama and Qwen2 checkpoints: LoRA,
QLoRA, DoRA and full fine-tuning run to completion with what a user reads afterwards."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from kubetune.tools.demo import TinyModelSpec, write_tiny_model, write_tiny_qwen2
from tests.support.cli import REPO, clean_env, error_lines, kubetune
from tests.support.trainer import SHORT, make_pvc, tune_run

pytestmark = pytest.mark.slow

# The args the kubeflow 0.5.0 SDK produces for the TorchTuneConfig, verbatim.
SDK_LORA_ARGS = [
    "dtype=bf16", "batch_size=4", "epochs=1", "dataset.data_dir=/workspace/dataset/data",
    "model.apply_lora_to_mlp=True", "model.lora_rank=8", "model.lora_alpha=16",
    "model.lora_dropout=0.1", "model.lora_attn_modules=[q_proj,v_proj,output_proj]",
    "dataset=torchtune.datasets.instruct_dataset", "dataset.source=parquet",
    "dataset.split=train", "dataset.train_on_input=False",
]


def sdk_args(config, dataset_uri: str) -> list[str]:
    from kubeflow.trainer.backends.kubernetes.utils import get_args_using_torchtune_config
    from kubeflow.trainer.types import types

    initializer = types.Initializer(
        dataset=types.HuggingFaceDatasetInitializer(storage_uri=dataset_uri))
    return get_args_using_torchtune_config(config, initializer)


def on_pvc(args: list[str], pvc) -> list[str]:
    """The SDK writes the controller's mount point; the test's PVC lives elsewhere."""
    return [a.replace("/workspace/", f"{pvc.root}/") for a in args]


def test_sdk_lora_args_train_the_tiny_llama(tmp_path, tiny_model_dir, tiny_dataset_dir):
    from kubeflow.trainer.types import types

    args = sdk_args(types.TorchTuneConfig(
        dtype=types.DataType.BF16, batch_size=4, epochs=1,
        peft_config=types.LoraConfig(lora_rank=8, lora_alpha=16, lora_dropout=0.1,
                                     apply_lora_to_mlp=True),
        dataset_preprocess_config=types.TorchTuneInstructDataset(
            source=types.DataFormat.PARQUET, split="train", train_on_input=False)),
        "hf://tatsu-lab/alpaca/data")
    assert args == SDK_LORA_ARGS

    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, tiny_dataset_dir)
    secret = "hf_kubetuneTestSecret123456"
    env = pvc.env(HF_TOKEN=secret)
    run_args = ["lora_finetune_single_device", "--config", "llama3_2/1B_lora_single_device",
                *pvc.runtime_args(), *on_pvc(args, pvc), "max_steps_per_epoch=3"]
    result = tune_run(pvc, *run_args, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert secret not in result.stdout + result.stderr
    assert not [p for p in pvc.output.rglob("*") if p.is_file() and secret.encode() in
                p.read_bytes()]
    # The controller's fixed 1B name yields to the checkpoint's real size.
    assert "the checkpoint's config.json is llama3 (layers=2, dim=64" in result.stderr
    metrics = pvc.metrics()
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for key in ("epoch", "loss", "lr", "tokens", "tokens_per_second", "peak_memory_bytes"):
        assert all(key in m for m in metrics), key
    summary = pvc.summary()
    assert summary["steps"] == 3 and summary["exit_reason"] == "completed"
    assert summary["tokens"] == sum(m["tokens"] for m in metrics) > 0
    assert summary["peak_memory_bytes"] > 0 and summary["wall_time_s"] > 0
    adapter = json.loads((pvc.output / "epoch_0" / "adapter_config.json").read_text())
    assert adapter["r"] == 8 and adapter["base_model_name_or_path"]
    marker = json.loads((pvc.output / "kubetune-complete.json").read_text())
    assert marker["checkpoint"] == "epoch_0" and marker["method"] == "lora"

    # The pod restarted after finishing (e.g. the JobSet restarted): nothing is redone.
    again = tune_run(pvc, *run_args, env=env)
    assert again.returncode == 0 and "nothing to do" in again.stderr
    assert (pvc.output / "kubetune-complete.json").read_text() == json.dumps(marker, indent=2)


def _fingerprint(model_dir, dataset_dir, output_dir) -> str:
    result = kubetune("train", "--dry-run", "--epochs", "1", env=clean_env(
        KUBETUNE_MODEL_DIR=str(model_dir), KUBETUNE_DATASET_DIR=str(dataset_dir),
        KUBETUNE_OUTPUT_DIR=str(output_dir)))
    assert result.returncode == 0, result.stderr[-3000:]
    config = yaml.safe_load(result.stdout.split("config:\n", 1)[1].split("\ncommand: ", 1)[0])
    return config["kubetune"]["fingerprint"]


def test_other_data_at_the_same_path_is_another_run(tmp_path, tiny_model_dir, tiny_dataset_dir):
    """What makes a finished run "this run" (nothing to do on a restart): the config and
    what the initializers fetched, not only the paths the config names."""
    import pyarrow.parquet as pq

    other = shutil.copytree(tiny_dataset_dir, tmp_path / "other-data")
    table = pq.read_table(other / "data" / "train.parquet")
    pq.write_table(table.slice(0, table.num_rows - 1), other / "data" / "train.parquet")
    workspace = tmp_path / "workspace"

    def fetched(source) -> str:
        init = kubetune("init-dataset", env=clean_env(KUBETUNE_WORKSPACE=str(workspace),
                                                      STORAGE_URI=f"file://{source}"))
        assert init.returncode == 0, init.stderr[-3000:]
        return _fingerprint(tiny_model_dir, workspace / "dataset", workspace / "output")

    first, changed, again = fetched(tiny_dataset_dir), fetched(other), fetched(tiny_dataset_dir)
    assert first != changed
    assert first == again


def _renamed_columns_dataset(path, rows=64):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kubetune.tools.demo.tiny_dataset import tiny_rows

    records = tiny_rows(rows)
    path.mkdir(parents=True)
    pq.write_table(pa.table({"question": [r["input"] for r in records],
                             "answer": [r["output"] for r in records]}),
                   path / "train.parquet")
    return path


def test_qwen2_lora_with_bare_repo_data_dir_column_map_and_system_prompt(tmp_path):
    from kubeflow.trainer.types import types

    # The SDK's forms for a bare dataset repo: data_dir=/workspace/dataset/. (upstream
    # torchtune crashes on it), a column map, and a system prompt holding '='.
    args = sdk_args(types.TorchTuneConfig(
        peft_config=types.LoraConfig(lora_rank=4, lora_alpha=8),
        dataset_preprocess_config=types.TorchTuneInstructDataset(
            source=types.DataFormat.PARQUET, new_system_prompt="Answer with a=b sums.",
            column_map={"input": "question", "output": "answer"})),
        "hf://someone/sums")
    assert "dataset.data_dir=/workspace/dataset/." in args
    assert "dataset.column_map={'input': 'question', 'output': 'answer'}" in args

    model = write_tiny_qwen2(tmp_path / "qwen")
    dataset = _renamed_columns_dataset(tmp_path / "sums")
    pvc = make_pvc(tmp_path / "pvc", model, dataset)
    result = tune_run(pvc, "lora_finetune_single_device", "--config",
                      "qwen2_5/1.5B_lora_single_device", *pvc.runtime_args("vocab.json"),
                      f"tokenizer.merges_file={pvc.model / 'merges.txt'}",
                      *on_pvc(args, pvc), *SHORT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "using torchtune.models.qwen2.lora_qwen2" in result.stderr
    assert pvc.complete() and len(pvc.metrics()) == 3
    merged = (pvc.output / "kubetune-config.yaml").read_text()
    assert "special_tokens_path" in merged  # ids from the checkpoint's tokenizer.json
    assert "new_system_prompt: Answer with a=b sums." in merged


def test_qlora_on_shapes_nf4_accepts(tmp_path, tiny_dataset_dir):
    # NF4 quantizes in blocks of 64 x 256 elements: every projection here is a multiple.
    model = write_tiny_model(tmp_path / "nf4-llama", TinyModelSpec(
        hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=4))
    pvc = make_pvc(tmp_path / "pvc", model, tiny_dataset_dir)
    result = tune_run(pvc, "lora_finetune_single_device", "--config",
                      "llama3_2/1B_qlora_single_device", *pvc.runtime_args(),
                      "model.quantize_base=True", "dataset=torchtune.datasets.instruct_dataset",
                      # The SDK's form for a dataset URI naming one file.
                      f"dataset.data_files={pvc.dataset / 'data' / 'train.parquet'}",
                      "dataset.source=parquet",
                      "epochs=1", *SHORT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "quantize_base: true" in (pvc.output / "kubetune-config.yaml").read_text()
    assert pvc.complete() and pvc.summary()["steps"] == 3


def test_dora_without_a_dataset_path_uses_the_initializers_descriptor(
        tmp_path, model_copy, tiny_dataset_dir):
    # A checkpoint whose special tokens are listed only in tokenizer_config.json.
    (model_copy / "tokenizer.json").unlink()
    pvc = make_pvc(tmp_path / "pvc", model_copy, None)
    # As for an S3 dataset: the args name no path; the dataset initializer wrote one.
    init = subprocess.run([sys.executable, "-m", "kubetune.entrypoints", "init-dataset"],
                          env=pvc.env(STORAGE_URI=f"file://{tiny_dataset_dir}"), cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert init.returncode == 0, init.stderr
    result = tune_run(pvc, "lora_finetune_single_device", "--config",
                      "llama3_2/1B_lora_single_device", *pvc.runtime_args(),
                      "model.use_dora=True", "model.lora_attn_modules=[q_proj,v_proj]",
                      "loss=torchtune.modules.loss.CEWithChunkedOutputLoss",
                      "dataset=torchtune.datasets.instruct_dataset", "epochs=1", *SHORT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "using the dataset initializer's 1 parquet file(s)" in result.stderr
    merged = (pvc.output / "kubetune-config.yaml").read_text()
    assert "use_dora: true" in merged
    assert "special_tokens_path: " + str(pvc.output / "kubetune-special-tokens.json") in merged
    special = json.loads((pvc.output / "kubetune-special-tokens.json").read_text())
    assert {"id": 256, "content": "<|begin_of_text|>"} in special["added_tokens"]
    assert pvc.complete()


def test_kubetune_train_full_finetune_from_env(tmp_path, tiny_model_dir, tiny_dataset_dir):
    output = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBETUNE_", "PET_"))}
    env.update(KUBETUNE_MODEL_DIR=str(tiny_model_dir), KUBETUNE_DATASET_DIR=str(tiny_dataset_dir),
               KUBETUNE_OUTPUT_DIR=str(output), KUBETUNE_METHOD="full", KUBETUNE_EPOCHS="1",
               KUBETUNE_MAX_STEPS="2", KUBETUNE_BATCH_SIZE="4",
               KUBETUNE_TERMINATION_LOG=str(tmp_path / "termination-log"))
    result = subprocess.run([sys.executable, "-m", "kubetune.entrypoints", "train",
                             "--learning-rate", "1e-4"], env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert error_lines(result) == []
    assert list((output / "epoch_0").glob("model-*.safetensors"))  # full weights, no adapter
    assert not (output / "epoch_0" / "adapter_model.safetensors").exists()
    assert (output / "kubetune-complete.json").is_file()
    assert "lr: 0.0001" in (output / "kubetune-config.yaml").read_text()
