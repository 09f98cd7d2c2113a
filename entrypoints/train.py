"""`kubetune train` (direct use) and `run_tune` (the `tune run` Kubeflow Trainer sends)."""

from __future__ import annotations

import click

from entrypoints.options import dataset_dir_option, model_dir_option, output_dir_option
from entrypoints.step import step_command
from kubetune import env
from kubetune.workspace import Workspace, workspace
from trainer import launch
from trainer.methods import METHODS, recipe_for
from trainer.tune_command import TuneRunRequest, parse_tune_run


def run_tune(argv: list[str], dry_run: bool = False) -> int:
    """Run ``tune run <argv...>`` as Kubeflow Trainer composes it."""
    return launch.run(launch.plan(parse_tune_run(argv), workspace()), dry_run=dry_run)


def run_train(model_dir: str, dataset_dir: str, output_dir: str, method: str = "lora",
              epochs: int | None = None, max_steps: int | None = None,
              batch_size: int | None = None, learning_rate: float | None = None,
              lora_rank: int | None = None, lora_alpha: float | None = None,
              seed: int | None = None, overrides: tuple[str, ...] = (),
              dry_run: bool = False) -> int:
    """Fine-tune the model in ``model_dir`` on ``dataset_dir``; checkpoints to ``output_dir``."""
    recipe, config, implied = recipe_for(method)
    # The base config names its own model's tokenizer file (/tmp/Llama-3.2-1B-...): drop
    # it so the tokenizer comes from model_dir, as the model does.
    args = [f"output_dir={output_dir}", f"checkpointer.checkpoint_dir={model_dir}",
            "~tokenizer.path", "dataset=torchtune.datasets.instruct_dataset", *implied]
    for key, value in (("epochs", epochs), ("max_steps_per_epoch", max_steps),
                       ("batch_size", batch_size), ("optimizer.lr", learning_rate),
                       ("model.lora_rank", lora_rank), ("model.lora_alpha", lora_alpha),
                       ("seed", seed)):
        if value is not None:
            args.append(f"{key}={value}")
    args += list(overrides)
    ws = workspace()
    ws = Workspace(ws.root, dataset_dir=_path(dataset_dir), model_dir=_path(model_dir),
                   output_dir=_path(output_dir), export_dir=ws.export_dir)
    request = TuneRunRequest(recipe=recipe, config=config, overrides=args)
    return launch.run(launch.plan(request, ws), dry_run=dry_run)


def _path(value: str):
    from pathlib import Path

    return Path(value)


@click.command("train", context_settings={"ignore_unknown_options": True})
@model_dir_option
@dataset_dir_option
@output_dir_option
@click.option("--method", envvar=env.METHOD, default="lora", show_default=True,
              type=click.Choice(sorted(METHODS)), help=f"Fine-tuning method [env: {env.METHOD}]")
@click.option("--epochs", envvar=env.EPOCHS, type=int, default=None,
              help=f"Epochs (default: the recipe's) [env: {env.EPOCHS}]")
@click.option("--max-steps", envvar=env.MAX_STEPS, type=int, default=None,
              help=f"Maximum steps per epoch [env: {env.MAX_STEPS}]")
@click.option("--batch-size", envvar=env.BATCH_SIZE, type=int, default=None,
              help=f"Per-device batch size [env: {env.BATCH_SIZE}]")
@click.option("--learning-rate", envvar=env.LEARNING_RATE, type=float, default=None,
              help=f"Peak learning rate [env: {env.LEARNING_RATE}]")
@click.option("--lora-rank", envvar=env.LORA_RANK, type=int, default=None,
              help=f"LoRA rank [env: {env.LORA_RANK}]")
@click.option("--lora-alpha", envvar=env.LORA_ALPHA, type=float, default=None,
              help=f"LoRA alpha [env: {env.LORA_ALPHA}]")
@click.option("--seed", envvar=env.SEED, type=int, default=None,
              help=f"Random seed [env: {env.SEED}]")
@click.option("--dry-run", is_flag=True,
              help="Print the recipe, the merged config and the command, then exit.")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@step_command("trainer")
def train(**options) -> int:
    """Fine-tune a model directly (without `tune run`); OVERRIDES are key=value config overrides."""
    return run_train(**options)
