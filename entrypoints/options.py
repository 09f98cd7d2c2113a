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
