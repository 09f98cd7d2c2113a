"""`kubetune install-tune`: put our `tune` in a bin directory, and torchtune's own CLI beside
it as `tune-torchtune`.

torchtune's distribution owns the `tune` console script, and two distributions writing
the same script clobber each other on install. So ours is written by this command after
install: in the image into /opt/kubetune/bin, first on PATH (torchtune's `tune` stays
beside the interpreter, shadowed); in `make`'s .venv into .venv/bin, over torchtune's.
Either way torchtune's CLI is reachable under one name, `tune-torchtune`, written here
too (our `tune` already hands every subcommand but `run` to it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kubetune.entrypoints.step import step_command
from kubetune.atomic_write import write_atomic

SCRIPT = """#!{python}
# kubetune's `tune`: `tune run` goes through kubetune, other subcommands to torchtune.
import sys
from kubetune.entrypoints.tune import main

if __name__ == "__main__":
    sys.exit(main())
"""
TORCHTUNE_SCRIPT = """#!{python}
# kubetune's `tune-torchtune`: torchtune's own CLI, every subcommand (`run` included).
import sys
from kubetune.entrypoints.tune import torchtune_cli

if __name__ == "__main__":
    torchtune_cli(sys.argv[1:])
"""
TORCHTUNE_COMMAND = "tune-torchtune"


def install_tune(bin_dir: Path, python: str = sys.executable) -> Path:
    """Write our `tune` and `tune-torchtune` into ``bin_dir``; return the `tune` path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(bin_dir / TORCHTUNE_COMMAND, TORCHTUNE_SCRIPT.format(python=python),
                 executable=True)
    target = bin_dir / "tune"
    write_atomic(target, SCRIPT.format(python=python), executable=True)
    return target


@click.command("install-tune")
@click.option("--bin-dir", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="Directory to write `tune` and `tune-torchtune` into (first on PATH in "
                   "the image).")
@step_command("install-tune")  # a read-only or misplaced --bin-dir is one line, exit 65
def install_tune_command(bin_dir: Path) -> None:
    """Install kubetune's `tune`, and torchtune's own CLI as `tune-torchtune`."""
    target = install_tune(bin_dir)
    click.echo(f"installed {target}")
