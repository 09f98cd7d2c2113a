"""The `kubetune` command group.

Subcommands are imported only when invoked: the initializer image has no torch, and
`kubetune init-model` must not pay for (or fail on) the trainer's imports.
"""

from __future__ import annotations

import importlib
import sys

import click

from kubetune import __version__
from kubetune.termination import write_termination_log

# name -> "module:attribute" of the click command
COMMANDS = {
    "init-dataset": "kubetune.entrypoints.init_storage:init_dataset",
    "init-model": "kubetune.entrypoints.init_storage:init_model",
    "train": "kubetune.entrypoints.train:train",
    "export": "kubetune.entrypoints.export:export_command",
    "local": "kubetune.entrypoints.local:local",
    "install-tune": "kubetune.entrypoints.shims:install_tune_command",
}


# command -> the step name its failure reports carry (as entrypoints/step.py prints them)
STEP_NAMES = {
    "init-dataset": "dataset-initializer",
    "init-model": "model-initializer",
    "train": "trainer",
    "export": "exporter",
}


def _step_of(ctx: click.Context | None) -> str:
    while ctx is not None and ctx.parent is not None and ctx.parent.parent is not None:
        ctx = ctx.parent  # the subcommand's own context, not a nested one's
    if ctx is None or ctx.parent is None:
        return "kubetune"
    return STEP_NAMES.get(ctx.info_name or "", ctx.info_name or "kubetune")


class LazyGroup(click.Group):
    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True,
             **extra):
        """click's own main, except that a usage error (exit 2) also reaches the
        termination log, as every other failure does, so a pod's status says why."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except click.ClickException as exc:
            ctx = exc.ctx if isinstance(exc, click.UsageError) else None
            write_termination_log(f"{_step_of(ctx)}: {exc.format_message()}")
            exc.show()  # click's own message, usage line included
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

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
