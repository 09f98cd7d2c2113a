"""The `kubetune` command group."""

from __future__ import annotations

import click

from entrypoints.export import export_command
from entrypoints.init_storage import init_dataset, init_model
from entrypoints.local import local
from entrypoints.shims import install_tune_command
from entrypoints.train import train
from kubetune import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kubetune")
def main() -> None:
    """kubetune: the in-pod steps of LLM fine-tuning under Kubeflow Trainer.

    Every option can also be set by the environment variable named in its help;
    an option given on the command line wins over its variable, which wins over
    the default.
    """


for command in (init_dataset, init_model, train, export_command, local, install_tune_command):
    main.add_command(command)
