"""The documented wrap points read what the step they wrap reads: `run_train(...)` called
from a runtime author's wrapper takes the runtime's and the TrainJob's KUBETUNE_* settings
(an argument given wins, then the variable, then the default), as `kubetune train` does."""

from __future__ import annotations

import os
import subprocess
import sys

import yaml

from tests.support.cli import REPO

WRAPPER = """
import sys
from kubetune.entrypoints.step import run_step
from kubetune.entrypoints.train import run_train
kwargs = eval(sys.argv[1])
sys.exit(run_step("trainer", lambda: run_train(dry_run=True, **kwargs)))
"""


def wrapped(kwargs: dict, **env_vars: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBETUNE_", "PET_"))}
    env.update(env_vars)
    return subprocess.run([sys.executable, "-c", WRAPPER, repr(kwargs)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def merged_config(stdout: str) -> dict:
    return yaml.safe_load(stdout.split("config:\n", 1)[1].split("\ncommand: ", 1)[0])


def test_run_train_reads_the_settings_of_the_environment(tmp_path, tiny_model_dir,
                                                         tiny_dataset_dir):
    result = wrapped({}, KUBETUNE_MODEL_DIR=str(tiny_model_dir),
                     KUBETUNE_DATASET_DIR=str(tiny_dataset_dir),
                     KUBETUNE_OUTPUT_DIR=str(tmp_path / "out"), KUBETUNE_LORA_RANK="4",
                     KUBETUNE_MAX_SEQ_LEN="128", KUBETUNE_MAX_STEPS="3")
    assert result.returncode == 0, result.stderr[-3000:]
    cfg = merged_config(result.stdout)
    assert cfg["model"]["lora_rank"] == 4
    assert cfg["tokenizer"]["max_seq_len"] == 128
    assert cfg["max_steps_per_epoch"] == 3
    assert cfg["output_dir"] == str(tmp_path / "out")


def test_run_train_arguments_win_over_the_environment(tmp_path, tiny_model_dir,
                                                      tiny_dataset_dir):
    result = wrapped({"model_dir": str(tiny_model_dir), "dataset_dir": str(tiny_dataset_dir),
                      "output_dir": str(tmp_path / "out"), "lora_rank": 8},
                     KUBETUNE_MODEL_DIR="/nonexistent", KUBETUNE_LORA_RANK="4",
                     KUBETUNE_MAX_STEPS="3")
    assert result.returncode == 0, result.stderr[-3000:]
    cfg = merged_config(result.stdout)
    assert cfg["model"]["lora_rank"] == 8 and cfg["max_steps_per_epoch"] == 3


def test_run_train_names_a_bad_variable(tmp_path):
    result = wrapped({}, KUBETUNE_LORA_RANK="four")
    assert result.returncode == 65, result.stderr[-2000:]
    assert "KUBETUNE_LORA_RANK" in result.stderr and "Traceback" not in result.stderr
