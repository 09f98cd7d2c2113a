"""`kubetune local key=value ...`: the user's trainer arguments override the demo's
defaults key by key, and only the defaults sized for the demo parts in use apply.

Checked on the config the trainer plans (its own `plan`, as `kubetune local` runs it before
any step), not on the argument list alone.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kubetune.entrypoints.local import demo_sources, pipeline
from kubetune.tools.local.preflight import check_trainer
from kubetune.tools.local.train_args import (DEMO_MODEL_ARGS, effective_train_args,
                                             merge)
from kubetune.trainer.config.recipe_config import load_config
from tests.support.cli import clean_env, kubetune

BASE_CONFIG = "llama3_2/1B_lora_single_device"  # the config `--method lora` runs


def planned(tmp_path: Path, user_args: list[str], model_uri: str | None = None,
            method: str = "lora"):
    """The trainer's planned config for `kubetune local [--model M] USER_ARGS`."""
    workdir = tmp_path / "run"
    demo_model, demo_dataset = demo_sources(tmp_path / "sources")
    args = effective_train_args(user_args, demo_model=model_uri is None, demo_dataset=True,
                                method=method)
    stages = pipeline(workdir, model_uri or demo_model, demo_dataset, method, args, None)
    command = stages[1][0].command
    cfg = check_trainer(command[command.index("run") + 1:], stages[1][0].env,
                        (workdir / "workspace").resolve(), model_uri or demo_model,
                        demo_dataset)
    assert not (workdir / "workspace").exists()  # planning wrote nothing
    return cfg


def test_a_users_epochs_keeps_the_demos_learning_rate_and_warmup(tmp_path):
    cfg = planned(tmp_path, ["epochs=2"])
    assert cfg.epochs == 2
    assert cfg.optimizer.lr == pytest.approx(3e-3)
    assert cfg.lr_scheduler.num_warmup_steps == 10
    assert cfg.model.lora_rank == 8 and cfg.batch_size == 8 and cfg.seed == 0


def test_the_users_value_wins_on_the_same_key(tmp_path):
    cfg = planned(tmp_path, ["optimizer.lr=1e-3", "lr_scheduler.num_warmup_steps=2",
                             "dataset._component_=torchtune.datasets.instruct_dataset"])
    assert cfg.optimizer.lr == pytest.approx(1e-3)
    assert cfg.lr_scheduler.num_warmup_steps == 2
    assert cfg.epochs == 3  # the demo's, not given


def test_an_own_model_gets_none_of_the_tiny_models_settings(tmp_path, tiny_model_dir):
    own = Path(shutil.copytree(tiny_model_dir, tmp_path / "my-model"))
    cfg = planned(tmp_path, ["epochs=1"], model_uri=str(own))
    base = load_config(BASE_CONFIG)
    # The config's own learning rate and LoRA settings, not the tiny model's 3e-3 / rank 8.
    assert cfg.optimizer.lr == pytest.approx(base.optimizer.lr) != pytest.approx(3e-3)
    assert cfg.model.lora_rank == base.model.lora_rank != 8
    assert cfg.model.lora_alpha == base.model.lora_alpha
    assert not cfg.model.get("apply_lora_to_output")  # the config leaves it off
    # The demo dataset is still the demo's: its settings stay.
    assert cfg.lr_scheduler.num_warmup_steps == 10 and cfg.batch_size == 8


def test_full_finetuning_gets_no_lora_settings(tmp_path):
    args = effective_train_args([], demo_model=True, demo_dataset=True, method="full")
    assert not [a for a in args if a.startswith("model.")]
    cfg = planned(tmp_path, [], method="full")  # planned: the full recipe takes no rank
    assert cfg.optimizer.lr == pytest.approx(3e-3)


def test_merge_rules():
    defaults = ["dataset=a.b", "dataset.split=train", "optimizer.lr=3e-3", "seed=0"]
    # Same key wins; `dataset` and `dataset._component_` are one key; `~section` drops the
    # defaults inside it; the user's arguments come last, in their order.
    assert merge(defaults, ["dataset._component_=c.d", "seed=1"]) == [
        "dataset.split=train", "optimizer.lr=3e-3", "dataset._component_=c.d", "seed=1"]
    assert merge(defaults, ["~dataset"]) == ["optimizer.lr=3e-3", "seed=0", "~dataset"]
    assert merge(defaults, []) == defaults
    assert all(a not in effective_train_args([], demo_model=False, demo_dataset=True,
                                             method="lora") for a in DEMO_MODEL_ARGS)


def test_the_effective_arguments_are_printed_before_the_run(tmp_path):
    # A batch size the demo dataset cannot fill: the run stops before any step, after
    # saying what it checked.
    result = kubetune("local", "--workdir", str(tmp_path / "run"), "epochs=2",
                      "batch_size=100000", env=clean_env(), timeout=300)
    assert result.returncode == 65
    line = next(x for x in result.stderr.splitlines() if "trainer arguments:" in x)
    args = line.split("trainer arguments: ", 1)[1].split()
    assert {"optimizer.lr=3e-3", "lr_scheduler.num_warmup_steps=10", "epochs=2",
            "batch_size=100000"} <= set(args)
    assert "epochs=3" not in args and "batch_size=8" not in args
