"""`kubetune train` options and env vars, and `--dry-run`: what a user sees before a run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from tests.support.cli import REPO, error_lines

pytestmark = pytest.mark.slow


def train(*args: str, **env_vars: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("KUBETUNE_", "PET_")) and k != "LORA_CONFIG"}
    env.update(env_vars)
    return subprocess.run([sys.executable, "-m", "kubetune.entrypoints", "train", *args], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def merged_config(stdout: str) -> dict:
    text = stdout.split("config:\n", 1)[1].split("\ncommand: ", 1)[0]
    return yaml.safe_load(text)


def test_dry_run_shows_recipe_config_and_command_from_env_and_options(
        tmp_path, tiny_model_dir, tiny_dataset_dir):
    result = train(
        "--dry-run", "--epochs", "2", "--lora-dropout", "0.05", "--warmup-steps", "7",
        "--lr-scheduler", "linear", "--column-map", "input=input,output=output",
        "--system-prompt", "Add: a=b", "--no-train-on-input", "gradient_accumulation_steps=2",
        KUBETUNE_MODEL_DIR=str(tiny_model_dir), KUBETUNE_DATASET_DIR=str(tiny_dataset_dir),
        KUBETUNE_OUTPUT_DIR=str(tmp_path / "out"), KUBETUNE_METHOD="dora",
        KUBETUNE_LEARNING_RATE="0.002", KUBETUNE_EPOCHS="5",  # the option wins: 2
        KUBETUNE_BATCH_SIZE="3", LORA_CONFIG='{"r": 4, "lora_alpha": 16, '
                                             '"target_modules": ["q_proj", "o_proj", "up_proj"]}')
    assert result.returncode == 0, result.stderr[-3000:]
    assert "recipe: lora_finetune_single_device" in result.stdout
    cfg = merged_config(result.stdout)
    assert cfg["epochs"] == 2 and cfg["batch_size"] == 3
    assert cfg["optimizer"]["lr"] == 0.002
    assert cfg["gradient_accumulation_steps"] == 2
    assert cfg["lr_scheduler"] == {"_component_": "kubetune.trainer.schedules.linear_schedule_with_warmup",
                                   "num_warmup_steps": 7}
    model = cfg["model"]
    assert model["use_dora"] is True and model["lora_rank"] == 4
    assert model["lora_alpha"] == 16 and model["lora_dropout"] == 0.05
    assert model["lora_attn_modules"] == ["q_proj", "output_proj"]
    assert model["apply_lora_to_mlp"] is True
    dataset = cfg["dataset"]
    assert dataset["new_system_prompt"] == "Add: a=b" and dataset["train_on_input"] is False
    assert dataset["column_map"] == {"input": "input", "output": "output"}
    assert "-m kubetune.trainer.recipe_process.bootstrap" in result.stdout.split("command: ", 1)[1]
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


def test_lora_config_option_wins_over_its_env_var_which_wins_over_the_default(
        tmp_path, tiny_model_dir, tiny_dataset_dir):
    dirs = dict(KUBETUNE_MODEL_DIR=str(tiny_model_dir),
                KUBETUNE_DATASET_DIR=str(tiny_dataset_dir),
                KUBETUNE_OUTPUT_DIR=str(tmp_path / "out"))
    both = train("--dry-run", "--lora-config", '{"r": 2, "lora_alpha": 4}',
                 LORA_CONFIG='{"r": 6, "lora_alpha": 12}', **dirs)
    env_only = train("--dry-run", LORA_CONFIG='{"r": 6, "lora_alpha": 12}', **dirs)
    neither = train("--dry-run", **dirs)
    for result in (both, env_only, neither):
        assert result.returncode == 0, result.stderr[-3000:]
    ranks = [(merged_config(r.stdout)["model"]["lora_rank"],
              merged_config(r.stdout)["model"]["lora_alpha"]) for r in (both, env_only, neither)]
    assert ranks[0] == (2, 4) and ranks[1] == (6, 12)
    assert ranks[2] not in ((2, 4), (6, 12))  # the recipe's own


def test_the_topology_that_picks_the_recipe_is_the_one_the_command_runs(
        tmp_path, tiny_model_dir, tiny_dataset_dir):
    result = train("--dry-run", "--method", "full", KUBETUNE_MODEL_DIR=str(tiny_model_dir),
                   KUBETUNE_DATASET_DIR=str(tiny_dataset_dir),
                   KUBETUNE_OUTPUT_DIR=str(tmp_path / "out"), PET_NNODES="2",
                   PET_NPROC_PER_NODE="1", PET_NODE_RANK="1", PET_MASTER_ADDR="job-node-0-0.job")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "recipe: full_finetune_distributed" in result.stdout
    command = result.stdout.split("command: ", 1)[1]
    for arg in ("--nnodes=2", "--nproc_per_node=1", "--node_rank=1",
                "--rdzv_endpoint=job-node-0-0.job:29500"):
        assert arg in command


@pytest.mark.parametrize("processes", [1, 2])
def test_a_one_process_group_starts_without_torchrun(tmp_path, tiny_model_dir, tiny_dataset_dir,
                                                     processes):
    """The controller's `tune run --nnodes 1 --nproc_per_node 1 <distributed recipe>`: one
    worker needs no rendezvous, so the launcher starts it itself (torchrun would import
    torch in a process of its own first); two still go through torchrun."""
    from tests.support.trainer import make_pvc, tune_run

    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, tiny_dataset_dir)
    result = tune_run(pvc, "--nnodes", "1", "--nproc_per_node", str(processes),
                      "lora_finetune_distributed", "--config", "llama3_2/1B_lora",
                      *pvc.runtime_args(), "dataset=torchtune.datasets.instruct_dataset",
                      "--kubetune-dry-run")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "recipe: lora_finetune_distributed" in result.stdout
    command = result.stdout.split("command: ", 1)[1].split()
    assert ("torch.distributed.run" in command) == (processes > 1)
    # Issue 52 §6: nothing imported from the working directory (a clone named kubetune).
    assert command[1] == "-P"
    assert command[command.index("-m", 1 if processes == 1 else 3) + 1] == \
        "kubetune.trainer.recipe_process.bootstrap"


def test_bad_lora_config_json_is_one_line(tmp_path, tiny_model_dir, tiny_dataset_dir):
    result = train("--dry-run", KUBETUNE_MODEL_DIR=str(tiny_model_dir),
                   KUBETUNE_DATASET_DIR=str(tiny_dataset_dir),
                   KUBETUNE_OUTPUT_DIR=str(tmp_path / "out"), LORA_CONFIG="{r: 4}",
                   KUBETUNE_TERMINATION_LOG=str(tmp_path / "termination-log"))
    assert result.returncode == 65
    assert len(error_lines(result)) == 1 and "LORA_CONFIG is not a JSON object" in result.stderr


def test_other_tune_subcommands_go_to_torchtune():
    from tests.support.cli import clean_env, tune

    result = tune("ls", env=clean_env())
    assert result.returncode == 0, result.stderr[-2000:]
    assert "lora_finetune_single_device" in result.stdout
    assert "llama3_2/1B_lora_single_device" in result.stdout


def test_a_warmup_for_a_config_without_a_scheduler_gets_one(tmp_path, tiny_model_dir,
                                                            tiny_dataset_dir):
    # torchtune's full fine-tuning configs name no lr_scheduler: a bare warm-up length
    # would reach the recipe as a section it cannot instantiate.
    result = train("--dry-run", "--method", "full", "--warmup-steps", "2",
                   KUBETUNE_MODEL_DIR=str(tiny_model_dir),
                   KUBETUNE_DATASET_DIR=str(tiny_dataset_dir),
                   KUBETUNE_OUTPUT_DIR=str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr[-2000:]
    scheduler = merged_config(result.stdout)["lr_scheduler"]
    assert scheduler == {"_component_": "torchtune.training.lr_schedulers."
                                        "get_cosine_schedule_with_warmup",
                         "num_warmup_steps": 2}


def test_a_torchrun_flag_is_known_from_torchrun_itself(tmp_path, tiny_model_dir,
                                                       tiny_dataset_dir):
    """--virtual-local-rank takes no value in torchrun's own parser; a hand-kept list that
    lacked it took the recipe's name for its value."""
    from tests.support.trainer import make_pvc, tune_run

    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, tiny_dataset_dir)
    result = tune_run(pvc, "--virtual-local-rank", "--nproc_per_node", "1",
                      "lora_finetune_single_device", "--config",
                      "llama3_2/1B_lora_single_device", *pvc.runtime_args(),
                      "dataset=torchtune.datasets.instruct_dataset",
                      "--kubetune-dry-run")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "recipe: lora_finetune_single_device" in result.stdout


def test_tune_run_help_shows_our_flags_beside_torchtunes():
    result = subprocess.run([sys.executable, "-m", "kubetune.entrypoints.tune", "run", "--help"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "--config" in result.stdout and "--nproc_per_node" in result.stdout  # torchtune's
    assert "--kubetune-dry-run" in result.stdout.split("--config", 1)[1]
