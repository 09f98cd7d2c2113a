"""A run that trains nothing, or trains garbage, is not a success (issue 22).

What a user would check after such a run: exit 65 (a restart would do the same), one
`error:` line saying why with the numbers and what to change, and nothing the exporter or
a restart would take for a result: no completion marker, no checkpoint of untrained or
non-finite weights. The cases the plan can see (rows counted exactly) are rows in
test_bad_inputs_trainer.py; these train a few steps of the tiny model.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import clean_env, error_lines, kubetune

FEW = ["--epochs", "1", "--gradient-accumulation-steps", "1", "dtype=fp32"]


def train(model: Path, dataset: Path, root: Path, *args: str) -> subprocess.CompletedProcess:
    return kubetune("train", "--model-dir", str(model), "--dataset-dir", str(dataset),
                    "--output-dir", str(root / "output"), *FEW, *args,
                    env=clean_env(KUBETUNE_TERMINATION_LOG=str(root / "termination-log")))


def refused(result: subprocess.CompletedProcess, root: Path) -> str:
    assert result.returncode == 65, result.stderr[-3000:]
    [line] = error_lines(result)
    assert (root / "termination-log").read_text().strip() == line.removeprefix("error: ")
    assert "Traceback" not in result.stderr
    output = root / "output"
    assert not (output / "kubetune-complete.json").exists()
    assert not list(output.glob("epoch_*"))  # no result for the exporter to find
    return line


def saved_weights(output: Path) -> list[Path]:
    return sorted(output.rglob("*.safetensors"))


def finite(path: Path) -> bool:
    from safetensors.torch import load_file

    return all(bool(t.isfinite().all()) for t in load_file(str(path)).values())


@pytest.fixture
def one_row(tiny_dataset_dir, tmp_path) -> Path:
    import pyarrow.parquet as pq

    table = pq.read_table(tiny_dataset_dir / "data" / "train.parquet")
    (tmp_path / "one-row" / "data").mkdir(parents=True)
    pq.write_table(table.slice(0, 1), tmp_path / "one-row" / "data" / "train.parquet")
    return tmp_path / "one-row"


def test_one_row_with_a_larger_batch_is_refused_before_the_recipe(tiny_model_dir, one_row,
                                                                  tmp_path):
    line = refused(train(tiny_model_dir, one_row, tmp_path, "--batch-size", "2"), tmp_path)
    # Named as the user set it (kubetune train's option), not as the config key.
    assert "makes no optimizer step: 1 row(s)" in line and "--batch-size 2" in line
    assert not (tmp_path / "output" / "kubetune-config.yaml").exists()  # nothing launched


def test_no_step_found_only_in_the_recipe_saves_nothing(tiny_model_dir, one_row, tmp_path):
    # Packed, the samples are counted in the recipe: the save that would follow an epoch
    # of no step is refused there.
    result = train(tiny_model_dir, one_row, tmp_path, "--batch-size", "2",
                   "dataset.packed=True")
    line = refused(result, tmp_path)
    assert "makes no optimizer step: 1 pack(s)" in line and "batch_size=2" in line
    assert "gradient_accumulation_steps=1" in line
    assert saved_weights(tmp_path / "output") == []


def test_an_infinite_learning_rate_stops_at_the_first_non_finite_loss(
        tiny_model_dir, tiny_dataset_dir, tmp_path):
    result = train(tiny_model_dir, tiny_dataset_dir, tmp_path, "--batch-size", "4",
                   "--max-steps", "5", "optimizer.lr=inf")
    line = refused(result, tmp_path)
    assert "at step 2" in line and "lower optimizer.lr" in line
    assert saved_weights(tmp_path / "output") == []
    losses = [json.loads(l)["loss"] for l in
              (tmp_path / "output" / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 2 and not math.isfinite(losses[-1])  # stopped there, not at 5


def test_divergence_keeps_the_last_finite_checkpoint(tiny_model_dir, tiny_dataset_dir,
                                                     tmp_path):
    # 1e16 (its warm-up's first step at half of it) leaves the first steps' weights finite
    # and huge; weight decay at that rate multiplies them by ~1e14 a step until they
    # overflow. (Step 1 no longer runs at lr 0: every warm-up starts above zero.) A
    # resumable checkpoint after every step: those of finite weights stay, the non-finite
    # one is never saved.
    result = train(tiny_model_dir, tiny_dataset_dir, tmp_path, "--batch-size", "4",
                   "--max-steps", "6", "--warmup-steps", "2", "--save-every-n-steps", "1",
                   "optimizer.lr=1e16")
    line = refused(result, tmp_path)
    assert "training diverged" in line and "lower optimizer.lr" in line
    output = tmp_path / "output"
    weights = saved_weights(output)
    assert weights and all(finite(path) for path in weights)
    record = json.loads((output / "kubetune-resume.json").read_text())
    assert (output / record["checkpoint"]).is_dir()

    # A restart says whether it continues that checkpoint or starts over, never silently.
    args = ["--batch-size", "4", "--max-steps", "6", "--warmup-steps", "2",
            "--save-every-n-steps", "1", "--dry-run"]
    same = train(tiny_model_dir, tiny_dataset_dir, tmp_path, *args, "optimizer.lr=1e16")
    assert same.returncode == 0, same.stderr[-2000:]
    assert f"note: resuming from {output / record['checkpoint']}" in same.stdout
    lower = train(tiny_model_dir, tiny_dataset_dir, tmp_path, *args, "optimizer.lr=3e-3")
    assert lower.returncode == 0, lower.stderr[-2000:]
    [line] = [l for l in lower.stdout.splitlines() if "resuming from" in l]
    assert line.startswith(f"note: not resuming from {output / record['checkpoint']}")
    assert "optimizer.lr: 1e+16 -> 0.003" in line and "starting over" in line
