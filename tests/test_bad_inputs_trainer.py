"""Trainer-side user mistakes, one row each: exit 65 (2 for a malformed command line),
exactly one `error:` line, no traceback, the same line in the termination log, and
nothing a re-run or the exporter would trust (no merged config, no completion marker).

Almost every row fails in the plan, before the recipe starts, so a row costs about one
process start; the ENOSPC row trains for real on a small tmpfs."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.cli import clean_env, kubetune
from tests.support.trainer import make_pvc, tune_run

RECIPE = ["lora_finetune_single_device", "--config", "llama3_2/1B_lora_single_device",
          "dataset=torchtune.datasets.instruct_dataset"]


@dataclass
class Row:
    id: str
    args: list[str]
    says: str  # in the error line
    via: str = "tune"  # "tune": `tune run` as Kubeflow composes it; "train": `kubetune train`
    env: dict[str, str] = field(default_factory=dict)
    code: int = 65


ROWS = [
    Row("batch_size=abc", ["batch_size=abc"], "batch_size=abc: must be a whole number"),
    Row("batch_size=0", ["batch_size=0"], "batch_size=0: must be a whole number >= 1"),
    Row("batch_size=2.5", ["batch_size=2.5"], "batch_size=2.5: must be a whole number"),
    Row("epochs=0", ["epochs=0"], "epochs=0: must be a whole number >= 1"),
    Row("epochs=-1", ["epochs=-1"], "epochs=-1"),
    Row("max_steps_per_epoch=0", ["max_steps_per_epoch=0"], "max_steps_per_epoch=0"),
    Row("gradient_accumulation_steps=abc", ["gradient_accumulation_steps=abc"],
        "gradient_accumulation_steps=abc"),
    Row("optimizer.lr=fast", ["optimizer.lr=fast"], "optimizer.lr=fast: must be a number > 0"),
    Row("optimizer.lr=0", ["optimizer.lr=0"], "optimizer.lr=0: must be a number > 0"),
    Row("model.lora_rank=0", ["model.lora_rank=0"], "model.lora_rank=0"),
    Row("model.lora_alpha=abc", ["model.lora_alpha=abc"], "model.lora_alpha=abc"),
    Row("model.lora_dropout=1.5", ["model.lora_dropout=1.5"], "must be a number in [0, 1)"),
    Row("tokenizer.max_seq_len=-1", ["tokenizer.max_seq_len=-1"], "tokenizer.max_seq_len=-1"),
    Row("typo epochz", ["epochz=1"], "unknown key epochz (did you mean epochs?)"),
    Row("typo batchsize", ["batchsize=4"], "unknown key batchsize (did you mean batch_size?)"),
    Row("typo model.lora_rnk", ["model.lora_rnk=5"],
        "unknown key model.lora_rnk (did you mean model.lora_rank?)"),
    Row("model key the builder lacks", ["model.lora_flavour=5"],
        "unknown key model.lora_flavour: torchtune.models.llama3.lora_llama3 takes no "
        "lora_flavour"),
    Row("typo dataset.colum_map", ["dataset.colum_map={input: a}"],
        "unknown key dataset.colum_map (did you mean dataset.column_map?)"),
    Row("typo optimizer.lrr", ["optimizer.lrr=1e-4"],
        "unknown key optimizer.lrr (did you mean optimizer.lr?)"),
    # A key the config has only in a section: the run would train without it.
    Row("section key given top-level", ["lora_rank=4"],
        "unknown key lora_rank (did you mean model.lora_rank?)"),
    Row("key nothing reads", ["foo.bar=1"],
        "unknown key foo.bar: the config has no foo and the recipe reads none"),
    # `tune run` reads `kubetune train`'s variables too, with the same checks.
    Row("KUBETUNE_EPOCHS=abc under tune run", [],
        "invalid value in KUBETUNE_EPOCHS: 'abc' is not a valid integer",
        env={"KUBETUNE_EPOCHS": "abc"}),
    Row("KUBETUNE_METHOD against the recipe", [],
        "KUBETUNE_METHOD=full, but the command runs lora_finetune_single_device as lora",
        env={"KUBETUNE_METHOD": "full"}),
    Row("dtype=fp8", ["dtype=fp8"], "dtype=fp8: must be one of bf16, fp32"),
    Row("device=tpu", ["device=tpu"], "device=tpu: must be cpu or cuda"),
    Row("dataset.packed=maybe", ["dataset.packed=maybe"], "dataset.packed=maybe: must be True"),
    Row("lora_attn_modules o_proj", ["model.lora_attn_modules=[q_proj,o_proj]"],
        "o_proj is output_proj"),
    Row("seed=abc", ["seed=abc"], "seed=abc: must be a whole number"),
    Row("KUBETUNE_SAVE_EVERY_N_STEPS=abc", [],
        "invalid value in KUBETUNE_SAVE_EVERY_N_STEPS: 'abc' is not a valid integer",
        env={"KUBETUNE_SAVE_EVERY_N_STEPS": "abc"}),
    # An option's value is named as typed (issue 53), not by the key it sets.
    Row("--lora-rank 0", ["--lora-rank", "0"], "--lora-rank 0: must be a whole number >= 1",
        via="train"),
    Row("--max-steps -5", ["--max-steps", "-5"], "--max-steps -5: must be", via="train"),
    Row("--epochs 0", ["--epochs", "0"], "--epochs 0: must be", via="train"),
    Row("LORA_CONFIG r=x", [], 'LORA_CONFIG r="x": must be a number', via="train",
        env={"LORA_CONFIG": '{"r": "x"}'}),
    Row("LORA_CONFIG r=0", [], "model.lora_rank=0", via="train",
        env={"LORA_CONFIG": '{"r": 0}'}),
    Row("LORA_CONFIG dropout=2", [], "model.lora_dropout=2", via="train",
        env={"LORA_CONFIG": '{"lora_dropout": 2}'}),
    Row("KUBETUNE_TRAIN_OVERRIDES bad quoting", [], "KUBETUNE_TRAIN_OVERRIDES cannot be split",
        via="train", env={"KUBETUNE_TRAIN_OVERRIDES": "dataset.new_system_prompt='Be brief"}),
    Row("KUBETUNE_TRAIN_OVERRIDES typo", [], "unknown key epochz", via="train",
        env={"KUBETUNE_TRAIN_OVERRIDES": "epochz=2"}),
    # Sizes that make no sense for the model or the data (the tiny model's v_proj is 64x32;
    # the tiny dataset has 512 rows).
    Row("model.lora_rank above the model's width", ["model.lora_rank=64"],
        "model.lora_rank=64 is larger than the model allows: v_proj is 64x32"),
    # Named as typed (issue 53), not by the key the option sets.
    Row("--lora-rank 4096", ["--lora-rank", "4096"], "--lora-rank 4096 is larger than the "
        "model allows: v_proj is 64x32, so a rank above 32 adds parameters and learns nothing "
        "more: set --lora-rank 32 or less", via="train"),
    Row("LORA_CONFIG r=33", [], "model.lora_rank=33 is larger than the model allows",
        via="train", env={"LORA_CONFIG": '{"r": 33}'}),
    Row("batch_size above the rows", ["batch_size=1000"],
        "makes no optimizer step: 512 row(s) over 1 process(es) make 0 batch(es) of "
        "batch_size=1000"),
    Row("accumulation beyond the batches", ["batch_size=64", "gradient_accumulation_steps=9"],
        "make 8 batch(es) of batch_size=64 per process (a partial batch is dropped), and one "
        "step takes gradient_accumulation_steps=9"),
    Row("--gradient-accumulation-steps 600", ["--batch-size", "1",
                                              "--gradient-accumulation-steps", "600"],
        "of --batch-size 1 per process (a partial batch is dropped), and one step takes "
        "--gradient-accumulation-steps 600 batch(es): lower --batch-size or "
        "--gradient-accumulation-steps", via="train"),
    Row("--epoch 2", ["--epoch", "2"], "Did you mean '--epochs'?", via="train", code=2),
    Row("--batch-size abc", ["--batch-size", "abc"], "'abc' is not a valid integer",
        via="train", code=2),
]


def _run(row: Row, model: Path, dataset: Path, root: Path, *extra: str
         ) -> tuple[subprocess.CompletedProcess, Path, Path]:
    if row.via == "tune":
        pvc = make_pvc(root, model, dataset)
        return (tune_run(pvc, *RECIPE, *pvc.runtime_args(), *row.args, *extra,
                         env=pvc.env(**row.env)), pvc.output, pvc.termination_log)
    term, output = root / "termination-log", root / "output"
    result = kubetune("train", "--model-dir", str(model), "--dataset-dir", str(dataset),
                      "--output-dir", str(output), *row.args, *extra,
                      env=clean_env(KUBETUNE_TERMINATION_LOG=str(term), **row.env))
    return result, output, term


def _check(row: Row, result: subprocess.CompletedProcess, output: Path, term: Path,
           traceback_allowed: bool = False) -> str:
    assert result.returncode == row.code, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.lower().startswith("error:")]
    assert len(errors) == 1, result.stderr[-2000:]
    assert row.says in errors[0]
    if not traceback_allowed:
        assert "Traceback" not in result.stderr
    if row.code == 65:
        assert term.read_text().strip() == errors[0].removeprefix("error: ")
    else:  # click's usage error: its own message, and the termination log says it too
        assert row.says in term.read_text()
    # Nothing the exporter or a re-run would take for a finished (or started) run.
    assert not (output / "kubetune-complete.json").exists()
    assert row.code != 65 or not (output / "summary.json").exists()
    return errors[0]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_input_is_one_line(row, tmp_path, tiny_model_dir, tiny_dataset_dir):
    result, output, term = _run(row, tiny_model_dir, tiny_dataset_dir, tmp_path)
    _check(row, result, output, term)
    if row.code == 65:
        assert not (output / "kubetune-config.yaml").exists()  # failed before launching


def test_there_are_at_least_twenty_rows():
    assert len(ROWS) >= 20


def _mount_tmpfs(path: Path, size: str) -> str | None:
    path.mkdir(parents=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True)
    except OSError as exc:
        return f"cannot run mount: {exc}"
    return None if done.returncode == 0 else f"mount -t tmpfs failed: {done.stderr.strip()}"


@pytest.mark.slow
def test_full_output_volume_while_saving_the_checkpoint(tmp_path, tiny_model_dir,
                                                        tiny_dataset_dir):
    """A 300 KB volume holds the merged config and the metrics but not the 0.5 MB
    checkpoint the recipe writes at the end of the epoch."""
    volume = tmp_path / "volume"
    why = _mount_tmpfs(volume, "300k")
    if why:
        pytest.skip(f"needs a small tmpfs (root, mount -t tmpfs): {why}")
    try:
        row = Row("ENOSPC", ["--epochs", "1", "--max-steps", "1", "--batch-size", "2"],
                  "output volume full", via="train")
        term, output = tmp_path / "termination-log", volume / "output"
        result = kubetune("train", "--model-dir", str(tiny_model_dir), "--dataset-dir",
                          str(tiny_dataset_dir), "--output-dir", str(output), *row.args,
                          env=clean_env(KUBETUNE_TERMINATION_LOG=str(term)))
        # The recipe's own traceback streams to stderr live, as every recipe line does;
        # what torch says there depends on the save path (safetensors' "No space left on
        # device", or torch.save's bare "iostream error"). The launcher's report is the one
        # line, naming the volume.
        line = _check(row, result, output, term, traceback_allowed=True)
        assert "enlarge the volume" in line and str(output) in line
    finally:
        subprocess.run(["umount", str(volume)], check=False)
