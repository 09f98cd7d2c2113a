"""`kubetune install-tune`: put our `tune` in a bin directory, keeping torchtune's reachable.

torchtune's distribution owns the `tune` console script, and two distributions writing
the same script clobber each other on install. So ours is written by this command after
install: in the image into a directory placed first on PATH; in `make`'s .venv into
.venv/bin, where torchtune's script is kept as `tune-torchtune`.
"""

from __future__ import annotations

import os
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
# Present in our shims written before and after the import root moved, so an old
# one is replaced, not kept as torchtune's.
MARKER = "# kubetune's `tune`:"


def install_tune(bin_dir: Path, python: str = sys.executable) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    target = bin_dir / "tune"
    if target.exists() and MARKER not in target.read_text(errors="replace"):
        os.replace(target, bin_dir / "tune-torchtune")
    write_atomic(target, SCRIPT.format(python=python), mode=0o755)
    return target


@click.command("install-tune")
@click.option("--bin-dir", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="Directory to write `tune` into (first on PATH in the image).")
@step_command("install-tune")  # a read-only or misplaced --bin-dir is one line, exit 65
def install_tune_command(bin_dir: Path) -> None:
    """Install kubetune's `tune` (torchtune's own is kept as tune-torchtune if present)."""
    target = install_tune(bin_dir)
    click.echo(f"installed {target}")
