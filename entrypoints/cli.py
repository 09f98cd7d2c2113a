"""The `kubetune` command group.

Subcommands are imported only when invoked: the initializer image has no torch, and
`kubetune init-model` must not pay for (or fail on) the trainer's imports.
"""

from __future__ import annotations

import importlib
import os
import sys

import click
from click.core import ParameterSource

from kubetune import __version__, env, logs
from kubetune.errors import EXIT_BAD_INPUT
from kubetune.suggest import closest
from kubetune.termination import report_failure

# name -> "module:attribute" of the click command
COMMANDS = {
    "init-dataset": "kubetune.entrypoints.init_storage:init_dataset",
    "init-model": "kubetune.entrypoints.init_storage:init_model",
    "train": "kubetune.entrypoints.train:train",
    "export": "kubetune.entrypoints.export:export_command",
    "local": "kubetune.entrypoints.local:local",
    "size": "kubetune.entrypoints.size:size",
    "validate": "kubetune.entrypoints.validate:validate",
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


def _envvar_set(param: click.Parameter | None) -> str | None:
    """The variable a parameter's bad value came from, when it came from one."""
    names = getattr(param, "envvar", None) or ()
    for name in [names] if isinstance(names, str) else names:
        if os.environ.get(name):  # os.environ: which of click's envvar= names was set
            return name
    return None


def usage_message(exc: click.ClickException) -> str:
    """click's message, except that a bad value read from a variable names the variable
    (the user set KUBETUNE_EPOCHS, not --epochs)."""
    ctx = getattr(exc, "ctx", None)
    param = getattr(exc, "param", None)
    if isinstance(exc, click.BadParameter) and ctx is not None and param is not None \
            and ctx.get_parameter_source(param.name) == ParameterSource.ENVIRONMENT:
        name = _envvar_set(param)
        if name is not None:
            return f"invalid value in {name}: {exc.message}"
    return exc.format_message()


class LazyGroup(click.Group):
    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True,
             **extra):
        """click's own main, except that every usage error (exit 2) is one `error:` line,
        as every other failure is, also in the termination log so a pod's status says why;
        and a bare `kubetune` is a request for help (exit 0)."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help())
            sys.exit(0)
        except click.ClickException as exc:
            ctx = exc.ctx if isinstance(exc, click.UsageError) else None
            if ctx is not None:
                # The usage line first; the error line last, where a reader looks.
                click.echo(f"{ctx.get_usage()}\nTry '{ctx.command_path} -h' for help.",
                           err=True)
            report_failure(f"{_step_of(ctx)}: {usage_message(exc)}")
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def resolve_command(self, ctx: click.Context, args: list[str]):
        """click's, with the "did you mean" it gives options but not commands."""
        name = args[0] if args else ""
        if name and not name.startswith("-") and name not in COMMANDS:
            guess = closest(name, set(COMMANDS))
            if guess is not None:
                ctx.fail(f"No such command '{name}' (did you mean '{guess}'?)")
        return super().resolve_command(ctx, args)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)


def _log_options(ctx: click.Context, quiet: bool, verbose: bool) -> None:
    if quiet and verbose:
        raise click.UsageError("-q and -v contradict each other: give one", ctx=ctx)
    if quiet or verbose:
        # Through the environment: every step, the recipe process and `kubetune local`'s
        # child steps read their level from it.
        os.environ[env.LOG_LEVEL] = "warning" if quiet else "debug"
    problem = logs.settings_problem()
    if problem is not None:
        report_failure(f"{_step_of(ctx.parent)}: {problem}")
        sys.exit(EXIT_BAD_INPUT)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kubetune")
@click.option("-q", "--quiet", is_flag=True,
              help="Warnings and errors only (KUBETUNE_LOG_LEVEL=warning): no progress lines.")
@click.option("-v", "--verbose", is_flag=True,
              help="Debug output too (KUBETUNE_LOG_LEVEL=debug): torchtune's config dump, "
                   "library warnings.")
@click.pass_context
def main(ctx: click.Context, quiet: bool, verbose: bool) -> None:
    """kubetune: the in-pod steps of LLM fine-tuning under Kubeflow Trainer.

    Every option can also be set by the environment variable named in its help;
    an option given on the command line wins over its variable, which wins over
    the default.
    """
    _log_options(ctx, quiet, verbose)

