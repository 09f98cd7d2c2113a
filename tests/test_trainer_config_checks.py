"""What the plan adds to a user's config, seen from outside: typo checks that never flag
a key our runtimes, our launcher or the Kubeflow SDK send; the user's metric logger kept
beside ours; samples longer than the model's context cut, and counted, instead of
crashing the recipe."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from kubetune.tools.demo import (TinyQwen2Spec, write_tiny_alpaca_dataset, write_tiny_dataset,
                           write_tiny_qwen2)
from kubetune.tools.demo.tiny_dataset import tiny_rows
from kubetune.tools.local.jobset import LocalJobSet
from kubetune.tools.local.runtime_merge import merge
from kubetune.tools.local.runtime_spec import default_trainjob, load_runtime
from kubetune.trainer.config.recipe_config import resolve_recipe
from tests.support.cli import REPO, clean_env
from tests.support.preference_data import pairs, trl_standard, write_rows
from tests.support.runtimes import runtime_file as runtime_file_path, runtime_files
from tests.support.sdk_trainjob import sdk_trainjob_spec
from tests.support.trainer import SHORT, make_pvc, tune_run

pytestmark = pytest.mark.filterwarnings("ignore:Support for class-based `config`")

RECIPE = ["lora_finetune_single_device", "--config", "llama3_2/1B_lora_single_device",
          "dataset=torchtune.datasets.instruct_dataset"]
# The one runtime whose trainer is a shell script (init, train, export in one pod).
SHELL_RUNTIMES = {"kubetune-llama3.1-8b-full-multinode.yaml"}
FLAGGED = re.compile(r"unknown key|warning: key")


@pytest.fixture(scope="module")
def sources(tmp_path_factory, tiny_model_dir, tiny_dataset_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sources")
    # Shapes NF4 quantizes (every projection a multiple of 64 x 256 elements): the QLoRA
    # runtime's plan checks that after the keys.
    nf4_qwen = TinyQwen2Spec(hidden_size=128, intermediate_size=256, num_key_value_heads=4)
    return {"llama": tiny_model_dir, "qwen": write_tiny_qwen2(root / "tiny-qwen2", nf4_qwen),
            "addition": tiny_dataset_dir,
            "alpaca": write_tiny_alpaca_dataset(root / "tiny-alpaca", rows=256),
            "qa": write_tiny_dataset(root / "tiny-qa", rows=256, columns=("question", "answer")),
            # The DPO runtime's data: preference pairs (TRL's standard shape).
            "preference": write_rows(root / "tiny-preference", pairs(trl_standard, 64))}


def _instruct(**kwargs):
    from kubeflow.trainer.types.types import TorchTuneInstructDataset

    return TorchTuneInstructDataset(**kwargs)


def _dry_run_trainer(runtime_file: str, spec: dict | None, model: Path, dataset: Path,
                     workdir: Path) -> subprocess.CompletedProcess:
    """The trainer container of the merged JobSet, as `kubetune local` would start it,
    with the launcher's dry-run flag: the plan, every check, no training."""
    runtime = load_runtime(runtime_file_path(runtime_file))
    trainjob = default_trainjob(runtime)
    if spec is not None:
        trainjob["spec"].update(spec)
    jobset = LocalJobSet(merge(runtime, trainjob), workdir)
    job = next(j for j in jobset.spec["replicatedJobs"] if j["name"] == "node")
    container = job["template"]["spec"]["template"]["spec"]["containers"][0]
    step = jobset.step(job, container, 0, 1)
    workspace = workdir / "workspace"
    (workspace / "model").symlink_to(model)
    (workspace / "dataset").symlink_to(dataset)
    if any(j["name"] == "teacher-initializer" for j in jobset.spec["replicatedJobs"]):
        (workspace / "teacher").symlink_to(model)  # a distillation runtime's teacher
    program, *args = step.command
    if program == "tune":
        argv = [sys.executable, "-m", "kubetune.entrypoints.tune", *args, "--kubetune-dry-run"]
    else:
        assert program == "kubetune" and args[0] == "train", step.command
        argv = [sys.executable, "-m", "kubetune.entrypoints", *args, "--dry-run"]
    env = clean_env(**{k: v for k, v in step.env.items() if k != "PATH"})
    return subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)


def _sdk_forms():
    return [("no dataset_preprocess_config", "hf://kubetune/tiny-alpaca/data", None, "alpaca"),
            ("source=PARQUET", "hf://kubetune/tiny-addition", "parquet", "addition"),
            ("no source, one file", "hf://kubetune/tiny-addition/data/train.parquet",
             _instruct(), "addition"),
            ("column_map", "hf://kubetune/tiny-qa",
             _instruct(column_map={"input": "question", "output": "answer"}), "qa")]


RUNTIMES = sorted(p.name for p in runtime_files() if p.name not in SHELL_RUNTIMES)


@pytest.mark.parametrize("runtime_file", RUNTIMES)
def test_no_key_a_runtime_sends_is_flagged(runtime_file, tmp_path, sources):
    """Every runtime's trainer command (drop-in: with the SDK's PARQUET form) plans clean."""
    spec = None
    if runtime_file.startswith("torchtune-"):
        spec = sdk_trainjob_spec(runtime_file_path(runtime_file))
    model = sources["qwen" if "qwen" in runtime_file else "llama"]
    data = sources["preference" if "-dpo-" in runtime_file else "addition"]
    result = _dry_run_trainer(runtime_file, spec, model, data, tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert not FLAGGED.search(result.stdout + result.stderr)


@pytest.mark.parametrize("form", _sdk_forms(), ids=lambda f: f[0])
def test_no_key_an_sdk_dataset_form_sends_is_flagged(form, tmp_path, sources):
    _, uri, preprocess, data = form
    spec = sdk_trainjob_spec(runtime_file_path("torchtune-llama3.2-1b"), dataset_uri=uri,
                             dataset_preprocess_config=preprocess)
    result = _dry_run_trainer("torchtune-llama3.2-1b.yaml", spec, sources["llama"],
                              sources[data], tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert not FLAGGED.search(result.stdout + result.stderr)
    assert "source: parquet" in result.stdout  # what the trainer will really read


def test_an_unknown_top_level_key_is_one_warning_only_with_the_users_own_recipe(
        tmp_path, tiny_model_dir, tiny_dataset_dir):
    # A recipe file of the user's may read keys no config has; torchtune's read none.
    recipe = tmp_path / "my_recipe.py"
    recipe.write_text(Path(resolve_recipe(RECIPE[0])[0]).read_text())
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, tiny_dataset_dir)
    result = tune_run(pvc, str(recipe), *RECIPE[1:], *pvc.runtime_args(), "foo.bar=1",
                      "--kubetune-dry-run")
    assert result.returncode == 0, result.stderr[-2000:]
    warned = [line for line in (result.stdout + result.stderr).splitlines()
              if "warning: key foo.bar" in line]
    assert len(warned) == 1


@pytest.mark.parametrize("key", ["low_cpu_ram=True", "cudnn_deterministic_mode=True"])
def test_a_top_level_key_the_recipe_reads_is_accepted(key, tmp_path, tiny_model_dir,
                                                      tiny_dataset_dir):
    """Keys torchtune's LoRA recipe reads with ``cfg.get`` that its config leaves out."""
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, tiny_dataset_dir)
    result = tune_run(pvc, *RECIPE, *pvc.runtime_args(), key, "--kubetune-dry-run")
    assert result.returncode == 0, result.stderr[-2000:]
    assert not FLAGGED.search(result.stdout + result.stderr)


@pytest.mark.slow
def test_the_users_disk_logger_gets_the_same_steps_as_ours(tmp_path, tiny_model_dir,
                                                           tiny_dataset_dir):
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, tiny_dataset_dir)
    disk = tmp_path / "disk-logs"
    result = tune_run(pvc, *RECIPE, *pvc.runtime_args(), *SHORT, "epochs=1", "dtype=fp32",
                      "metric_logger=torchtune.training.metric_logging.DiskLogger",
                      f"metric_logger.log_dir={disk}")
    assert result.returncode == 0, result.stderr[-3000:]
    ours = {m["step"]: m["loss"] for m in pvc.metrics() if "loss" in m}
    [log_file] = disk.glob("log_*.txt")
    theirs = {}
    for line in log_file.read_text().splitlines():
        match = re.match(r"Step (\d+) \| .*\bloss:([0-9.eE+-]+)", line)
        if match:
            theirs[int(match.group(1))] = float(match.group(2))
    assert sorted(theirs) == sorted(ours) == [1, 2, 3]
    assert all(theirs[s] == pytest.approx(ours[s], rel=1e-6) for s in ours)
    merged = yaml.safe_load((pvc.output / "kubetune-config.yaml").read_text())
    assert merged["metric_logger"]["also"]["log_dir"] == str(disk)


def _with_long_rows(root: Path, rows: int, long_at: tuple[int, ...]) -> Path:
    records = tiny_rows(rows)
    for i in long_at:  # ~1600 tokens of the tiny byte-level tokenizer; the context is 512
        records[i] = {"input": "12+34=" * 270, "output": "46"}
    (root / "data").mkdir(parents=True)
    pq.write_table(pa.table({"input": [r["input"] for r in records],
                             "output": [r["output"] for r in records]}),
                   root / "data" / "train.parquet")
    return root


@pytest.mark.slow
def test_samples_longer_than_the_context_are_cut_and_counted(tmp_path, tiny_model_dir):
    dataset = _with_long_rows(tmp_path / "long", rows=40, long_at=(3, 17, 29))
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, dataset)
    # Cut to the context, the long rows lose their answers, so they are left out: the
    # first step, of batch_size 37, holds every other sample.
    result = tune_run(pvc, *RECIPE, *pvc.runtime_args(), "batch_size=37", "epochs=1",
                      "max_steps_per_epoch=1", "gradient_accumulation_steps=1", "dtype=fp32")
    assert result.returncode == 0, result.stderr[-3000:]
    said = [line for line in result.stdout.splitlines() if "samples are longer than" in line]
    assert said == ["train: 3 of 40 samples are longer than tokenizer.max_seq_len=512 (the "
                    "model's context or the packing length) and were cut to it; set "
                    "tokenizer.max_seq_len to choose the limit yourself"]
    assert "train: dropped 3 of 40 rows with no token to train on" in result.stderr
    merged = yaml.safe_load((pvc.output / "kubetune-config.yaml").read_text())
    assert merged["tokenizer"]["max_seq_len"] == 512


def test_a_max_seq_len_the_user_set_is_kept_and_nothing_is_counted(tmp_path, tiny_model_dir):
    dataset = _with_long_rows(tmp_path / "long", rows=40, long_at=(3,))
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, dataset)
    result = tune_run(pvc, *RECIPE, *pvc.runtime_args(), "tokenizer.max_seq_len=256",
                      "--kubetune-dry-run")
    assert result.returncode == 0, result.stderr[-2000:]
    config = yaml.safe_load(result.stdout.split("config:\n", 1)[1].split("\ncommand:", 1)[0])
    assert config["tokenizer"]["max_seq_len"] == 256
    assert config["kubetune"]["count_cut_samples"] is False
