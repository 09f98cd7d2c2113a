"""The `kubetune` command group.

Subcommands are imported only when invoked: the initializer image has no torch, and
`kubetune init-model` must not pay for (or fail on) the trainer's imports.
"""

from __future__ import annotations

import importlib

import click

from kubetune import __version__

# name -> "module:attribute" of the click command
COMMANDS = {
    "init-dataset": "entrypoints.init_storage:init_dataset",
    "init-model": "entrypoints.init_storage:init_model",
    "train": "entrypoints.train:train",
    "export": "entrypoints.export:export_command",
    "local": "entrypoints.local:local",
    "install-tune": "entrypoints.shims:install_tune_command",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kubetune")
def main() -> None:
    """kubetune: the in-pod steps of LLM fine-tuning under Kubeflow Trainer.

    Every option can also be set by the environment variable named in its help;
    an option given on the command line wins over its variable, which wins over
    the default.
    """
