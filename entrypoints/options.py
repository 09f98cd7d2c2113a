"""Click options shared by several steps, each bound to its environment variable."""

from __future__ import annotations

from typing import Callable

import click

from kubetune import env
from kubetune.workspace import workspace


def _default(attr: str) -> Callable[[], str]:
    return lambda: str(getattr(workspace(), attr))


def dir_option(flag: str, envvar: str, attr: str, help_text: str):
    return click.option(
        flag, envvar=envvar, default=_default(attr), type=click.Path(path_type=str),
        show_default=f"$KUBETUNE_WORKSPACE/{attr.removesuffix('_dir')}, else /workspace/"
                     f"{attr.removesuffix('_dir')}",
        show_envvar=True, help=help_text,
    )


model_dir_option = dir_option("--model-dir", env.MODEL_DIR, "model_dir",
                              "Model directory (the model initializer's output).")
dataset_dir_option = dir_option("--dataset-dir", env.DATASET_DIR, "dataset_dir",
                                "Dataset directory (the dataset initializer's output).")
output_dir_option = dir_option("--output-dir", env.OUTPUT_DIR, "output_dir",
                               "Trainer output directory (checkpoints, metrics).")


def method_option(help_text: str):
    """``--method`` (KUBETUNE_METHOD): the fine-tuning method, one declaration for every
    command that takes it."""
    from kubetune.trainer.request.methods import METHOD_NAMES

    return click.option("--method", envvar=env.METHOD, default="lora", show_default=True,
                        show_envvar=True, type=click.Choice(METHOD_NAMES), help=help_text)


def objective_option(help_text: str):
    """``--objective`` (KUBETUNE_OBJECTIVE): what the method optimises, its choices the
    objectives' registry's."""
    from kubetune.trainer.objectives.registry import NAMES

    return click.option("--objective", envvar=env.OBJECTIVE, default="sft", show_default=True,
                        show_envvar=True, type=click.Choice(NAMES), help=help_text)


def repeatable_option(flag: str, name: str, envvar: str, metavar: str, help_text: str):
    """An option given once per value (``--image A --image B``), or as its variable's
    space-separated words."""
    return click.option(flag, name, multiple=True, envvar=envvar, metavar=metavar,
                        show_envvar=True,
                        help=f"{help_text}; repeatable (the variable: space-separated)")
