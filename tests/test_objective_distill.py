"""Knowledge distillation on the rails SFT has: torchtune's KD recipes drop-in (the
teacher's checkpoint fitted like the student's) and chosen by `--objective distill`, the
teacher fetched by `kubetune local`, the KD and CE parts of the loss on the progress line,
the summary and the report, exact resume, 2 processes, the export, and the checks a
teacher can fail (missing, another tokenizer, another vocabulary) as one line, exit 65."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

from kubetune.errors import EXIT_BAD_INPUT, BadInputError
from kubetune.tools.demo import write_tiny_dataset
from kubetune.tools.demo.tiny_model import TinyModelSpec, write_tiny_model
from kubetune.trainer.objectives import registry
from kubetune.trainer.request.topology import Topology
from tests.support.cli import clean_env, kubetune
from tests.support.trainer import make_pvc, tune_run

KD_SINGLE = ["knowledge_distillation_single_device", "--config",
             "llama3_2/8B_to_1B_KD_lora_single_device"]
KD_DISTRIBUTED = ["knowledge_distillation_distributed", "--config",
                  "llama3_2/8B_to_1B_KD_lora_distributed"]
ROWS = 24  # 6 steps of 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory) -> Path:
    """A deeper tiny Llama-3 with other weights and the student's tokenizer."""
    return write_tiny_model(tmp_path_factory.mktemp("sources") / "teacher",
                            TinyModelSpec(num_hidden_layers=3, seed=7))


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory) -> Path:
    return write_tiny_dataset(tmp_path_factory.mktemp("sources") / "small", rows=ROWS)


def kd_args(pvc, teacher: Path | None) -> list[str]:
    named = [f"teacher_checkpointer.checkpoint_dir={teacher}"] if teacher else []
    return [*KD_SINGLE, *pvc.runtime_args(), *named, "epochs=1", "batch_size=4",
            "gradient_accumulation_steps=1", "dtype=fp32", "seed=1", "optimizer.lr=3e-3",
            "lr_scheduler.num_warmup_steps=1", "model.lora_rank=8"]


@pytest.fixture(scope="module")
def drop_in(tmp_path_factory, tiny_model_dir, teacher_dir, small_dataset):
    """A user's `tune run` of torchtune's KD recipe and config, the teacher named as in
    torchtune's docs: the run every assertion about one process reads."""
    from tests.test_trainer_resume import deterministic_env

    pvc = make_pvc(tmp_path_factory.mktemp("drop-in") / "pvc", tiny_model_dir, small_dataset)
    result = tune_run(pvc, *kd_args(pvc, teacher_dir), env=deterministic_env(pvc))
    assert result.returncode == 0, result.stderr[-3000:]
    return pvc, result


def test_objective_distill_picks_torchtunes_kd_recipe_per_topology():
    one = registry.get("distill").recipe_for("lora", Topology(1, 1, 0, None))
    two = registry.get("distill").recipe_for("dora", Topology(1, 2, 0, None))
    assert one[:2] == ("knowledge_distillation_single_device",
                       "llama3_2/8B_to_1B_KD_lora_single_device") and one[2] == []
    assert two[0] == "knowledge_distillation_distributed" and two[2] == ["model.use_dora=True"]
    assert registry.of_recipe("knowledge_distillation_distributed").name == "distill"
    assert registry.of_recipe("lora_finetune_single_device").name == "sft"


@pytest.mark.parametrize("method", ["full", "qlora"])
def test_a_method_no_kd_recipe_runs_is_one_line_naming_what_can(method):
    with pytest.raises(BadInputError, match=f"distillation with method {method}: .*; "
                                            "available: lora or dora"):
        registry.get("distill").recipe_for(method, Topology(1, 1, 0, None))


def test_the_memory_plan_counts_the_teacher(tmp_path):
    from tests.test_size import LLAMA_3_1_8B, config_file, size

    (tmp_path / "student").mkdir()
    (tmp_path / "teacher").mkdir()
    student = config_file(tmp_path / "student", LLAMA_3_1_8B)
    teacher = config_file(tmp_path / "teacher", {**LLAMA_3_1_8B, "num_hidden_layers": 64})
    common = ["--model", str(student), "--gpu-memory", "80Gi", "--max-seq-len", "2048"]
    sft = size(*common)
    kd = size(*common, "--objective", "distill", "--teacher", str(teacher))
    assert kd["gpu_memory_gib_per_device"] > sft["gpu_memory_gib_per_device"] + 10
    missing = kubetune("size", *common, "--objective", "distill")
    assert missing.returncode == EXIT_BAD_INPUT and "--teacher MODEL" in missing.stderr


def test_the_loss_parts_reach_the_progress_line_and_the_trainjob_status(tmp_path, capsys):
    from kubetune.trainer.metric_logging.metric_logger import JsonLinesMetricLogger
    from kubetune.trainer.metric_logging.train_progress import TrainProgress

    logger = JsonLinesMetricLogger(str(tmp_path))
    logger.log_dict({"loss": 2.5, "class_loss": 2.0, "kd_loss": 3.0, "lr": 1e-3}, step=1)
    logger.close()
    [record] = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    assert "loss 2.5000 | ce 2.0000 | kd 3.0000 | lr" in capsys.readouterr().out
    status = TrainProgress(environ={}).status_metrics(record)
    assert (status["ce_loss"], status["kd_loss"]) == ("2", "3")


@pytest.mark.slow
def test_drop_in_kd_run_fits_the_teachers_checkpoint_and_reports_both_loss_parts(drop_in):
    pvc, result = drop_in
    # torchtune's config names an 8B teacher in 4 shards: the teacher on disk is used.
    assert "teacher: " in result.stderr and "layers=3" in result.stderr
    steps = [m for m in pvc.metrics() if "loss" in m]
    assert len(steps) == ROWS // 4
    line = next(x for x in result.stdout.splitlines() if "step 1/" in x)
    assert f"| ce {steps[0]['class_loss']:.4f} | kd {steps[0]['kd_loss']:.4f} |" in line
    # The loss is (1 - kd_ratio) * ce + kd_ratio * kd, kd_ratio 0.5 in torchtune's config.
    assert steps[0]["loss"] == pytest.approx((steps[0]["class_loss"] + steps[0]["kd_loss"]) / 2,
                                             rel=1e-5)
    summary = pvc.summary()["distillation"]
    assert summary["first_ce_loss"] == pytest.approx(steps[0]["class_loss"])
    assert summary["last_kd_loss"] == pytest.approx(steps[-1]["kd_loss"])
    assert summary["last_ce_loss"] < summary["first_ce_loss"]
    report = (pvc.output / "kubetune-report.md").read_text()
    assert "- loss parts: cross-entropy" in report and "; KD " in report
    assert pvc.complete() and (pvc.output / "epoch_0" / "adapter_model.safetensors").is_file()


@pytest.mark.slow
def test_kd_stopped_mid_epoch_resumes_exactly(tmp_path, drop_in, tiny_model_dir, teacher_dir,
                                              small_dataset):
    from tests.test_trainer_resume import (assert_same_training, deterministic_env,
                                           stop_after)

    reference, _ = drop_in
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, small_dataset)
    args = kd_args(pvc, teacher_dir)
    assert stop_after(tmp_path, pvc, args, deterministic_env(pvc), 2, "first") < ROWS // 4
    result = tune_run(pvc, *args, env=deterministic_env(pvc))
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_training(pvc, reference, "epoch_0", adapter=True)


@pytest.mark.slow
def test_two_processes_distil_from_the_workspace_teacher(tmp_path, tiny_model_dir, teacher_dir,
                                                         small_dataset):
    # No teacher named: the teacher initializer's /workspace/teacher.
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, small_dataset)
    (pvc.root / "teacher").symlink_to(teacher_dir)
    result = tune_run(pvc, f"--rdzv_endpoint=127.0.0.1:{free_port()}", *KD_DISTRIBUTED,
                      *pvc.runtime_args(), "max_steps_per_epoch=2", "batch_size=2",
                      "gradient_accumulation_steps=1", "dtype=fp32", "model.lora_rank=8",
                      env=pvc.env(PET_NNODES="1", PET_NPROC_PER_NODE="2", PET_NODE_RANK="0"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"teacher: {pvc.root / 'teacher'}" in result.stderr
    summary = pvc.summary()
    assert summary["world_size"] == 2 and summary["steps"] == 2
    assert summary["distillation"]["first_kd_loss"] > 0


@pytest.mark.slow
def test_kubetune_local_fetches_the_teacher_and_exports_the_student(tmp_path, teacher_dir):
    result = kubetune("local", "--workdir", str(tmp_path / "wd"), "--objective", "distill",
                      "--teacher", f"file://{teacher_dir}", "--val-fraction", "0.05",
                      "--val-prompts", "0",
                      "epochs=1", "max_steps_per_epoch=2", "dtype=fp32",
                      env=clean_env(KUBETUNE_TERMINATION_LOG=str(tmp_path / "tl"),
                                    EXPORT_FORMAT="both"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "==> teacher-initializer: ok" in result.stdout
    assert "loss parts: ce " in result.stdout
    # The held-out set: the student's cross-entropy on it, base -> last, as for SFT.
    assert "val loss: " in result.stdout
    workspace = tmp_path / "wd" / "workspace"
    assert (workspace / "teacher" / "model.safetensors").is_file()
    manifest = json.loads((workspace / "export" / "manifest.json").read_text())
    assert manifest["format"] == "both"
    exported = {Path(f["path"]).name for f in manifest["files"]}
    assert "adapter_model.safetensors" in exported
    # The merged student: the base's weights with the adapter folded in.
    assert any(name.startswith("model") and name.endswith(".safetensors") for name in exported)


def _dry_run(tmp_path: Path, model: Path, data: Path, teacher: Path | None):
    ws = tmp_path / "ws"
    if teacher is not None:
        ws.mkdir(exist_ok=True)
        (ws / "teacher").symlink_to(teacher)
    return kubetune("train", "--objective", "distill", "--model-dir", str(model),
                    "--dataset-dir", str(data), "--output-dir", str(tmp_path / "out"),
                    "--dry-run", env=clean_env(KUBETUNE_WORKSPACE=str(ws),
                                               KUBETUNE_TERMINATION_LOG=str(tmp_path / "tl")))


def _error_line(result) -> str:
    assert result.returncode == EXIT_BAD_INPUT, result.stderr[-2000:]
    [line] = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    return line


def test_a_missing_teacher_is_one_line(tmp_path, tiny_model_dir, tiny_dataset_dir):
    line = _error_line(_dry_run(tmp_path, tiny_model_dir, tiny_dataset_dir, None))
    assert f"no teacher model at {tmp_path / 'ws' / 'teacher'}" in line
    local = kubetune("local", "--workdir", str(tmp_path / "wd"), "--objective", "distill",
                     env=clean_env(KUBETUNE_TERMINATION_LOG=str(tmp_path / "tl2")))
    assert "--objective distill needs a teacher: --teacher URI" in _error_line(local)
    # With a runtime, its third initializer fetches the teacher: the option is refused.
    runtime = kubetune("local", "--workdir", str(tmp_path / "wd2"), "--runtime",
                       "runtimes/base/kubetune-llama3.2-1b-distill-lora.yaml", "--teacher",
                       str(tmp_path), env=clean_env(KUBETUNE_TERMINATION_LOG=str(tmp_path / "t3")))
    assert "with --runtime, --teacher would be ignored" in _error_line(runtime)


def test_a_named_teacher_directory_that_is_not_there_is_one_line(tmp_path, tiny_model_dir,
                                                                 tiny_dataset_dir):
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, tiny_dataset_dir)
    result = tune_run(pvc, *KD_SINGLE, *pvc.runtime_args(),
                      f"teacher_checkpointer.checkpoint_dir={tmp_path / 'nope'}",
                      "--kubetune-dry-run")
    assert "no teacher model at" in _error_line(result)
    assert "set teacher_checkpointer.checkpoint_dir" in _error_line(result)


def test_a_teacher_of_another_vocabulary_is_one_line(tmp_path, tiny_model_dir,
                                                     tiny_dataset_dir):
    from kubetune.tools.demo.tiny_qwen2 import write_tiny_qwen2

    qwen = write_tiny_qwen2(tmp_path / "qwen")
    line = _error_line(_dry_run(tmp_path, tiny_model_dir, tiny_dataset_dir, qwen))
    assert "the teacher's vocab_size is 259, the student's 269" in line


def test_a_teacher_of_another_tokenizer_is_one_line(tmp_path, tiny_model_dir,
                                                    tiny_dataset_dir, teacher_dir):
    # The same vocabulary size, two tokens' ids swapped: logits compared id by id mismatch.
    other = Path(shutil.copytree(teacher_dir, tmp_path / "other"))
    tokenizer = json.loads((other / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    a, b = list(vocab)[10:12]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    line = _error_line(_dry_run(tmp_path, tiny_model_dir, tiny_dataset_dir, other))
    assert "the teacher's tokenizer" in line and "differs from the student's" in line


@pytest.mark.slow
def test_the_distillation_runtime_on_two_nodes_with_the_teacher_patched(tmp_path,
                                                                         tiny_model_dir,
                                                                         teacher_dir,
                                                                         small_dataset):
    # The runtime as a TrainJob runs it (merged as the controller does), on 2 nodes; the
    # teacher's URI changed with a runtimePatch, as examples/trainjobs/ shows.
    import yaml

    from tests.support.runtimes import initializer_uris, runtime_file, write_trainjob

    runtime = "kubetune-llama3.2-1b-distill-lora"
    example = yaml.safe_load((Path(__file__).parents[1] / "examples" / "trainjobs"
                              / "llama3.2-1b-distill.yaml").read_text())
    patch = example["spec"]["runtimePatches"]
    container = (patch[0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
                 ["template"]["spec"]["template"]["spec"]["containers"][0])
    container["env"] = [{"name": "STORAGE_URI", "value": f"file://{teacher_dir}"}]
    env = {"KUBETUNE_MAX_STEPS": "2", "KUBETUNE_BATCH_SIZE": "2", "KUBETUNE_DTYPE": "fp32",
           "KUBETUNE_GRADIENT_ACCUMULATION_STEPS": "1",
           "KUBETUNE_LORA_RANK": "8", "KUBETUNE_LORA_ALPHA": "16", "KUBETUNE_WARMUP_STEPS": "0",
           "KUBETUNE_MAX_SEQ_LEN": "64", "KUBETUNE_PACKING": "false"}
    job = write_trainjob(tmp_path / "trainjob.yaml", runtime, {
        **initializer_uris(f"file://{tiny_model_dir}", f"file://{small_dataset}"),
        "trainer": {"numNodes": 2, "numProcPerNode": 1,
                    "env": [{"name": k, "value": v} for k, v in env.items()]},
        "runtimePatches": patch})
    result = kubetune("local", "--workdir", str(tmp_path / "run"), "--runtime",
                      str(runtime_file(runtime)), "--trainjob", str(job), env=clean_env(),
                      timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    workspace = tmp_path / "run" / "workspace"
    summary = json.loads((workspace / "output" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["distillation"]["last_kd_loss"] > 0
    assert json.loads((workspace / "teacher" / "config.json").read_text())[
        "num_hidden_layers"] == 3
    assert (workspace / "export" / "manifest.json").is_file()
