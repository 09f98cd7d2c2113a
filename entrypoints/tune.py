"""The `tune` command of our images: `tune run` goes through kubetune's launcher, every
other subcommand (ls, cp, cat, validate, download) goes to torchtune's own CLI.

This file is installed as ``tune`` by ``kubetune install-tune`` (see entrypoints/shims.py),
not declared as a console script: torchtune already owns that name.
"""

from __future__ import annotations

import sys

# Our flags of `tune run`, taken out before torchtune or torchrun see the arguments.
KUBETUNE_RUN_FLAGS = {
    "--kubetune-dry-run": "print the recipe, the merged config and the torchrun command "
                          "kubetune would run; run nothing",
}


def run_help() -> str:
    """What `tune run --help` adds below torchtune's own help."""
    lines = ["", "kubetune (this `tune` runs `tune run` through kubetune's launcher):"]
    lines += [f"  {flag:<22}{text}" for flag, text in KUBETUNE_RUN_FLAGS.items()]
    return "\n".join(lines)


def torchtune_cli(argv: list[str]) -> None:
    """Hand the call to torchtune's CLI unchanged, in this process, as torchtune's own
    `tune` script runs it; torchao's known import warnings stay out (``logs``)."""
    import importlib.util

    from kubetune import logs

    if importlib.util.find_spec("torchtune") is None:
        from kubetune.termination import report_failure

        report_failure("tune: torchtune is not installed here: `tune` needs the trainer image "
                       "/ `pip install kubetune[train]`")
        sys.exit(65)
    logs.quiet_libraries()  # before torchtune imports torchao
    from torchtune._cli.tune import main as torchtune_main

    sys.argv = ["tune", *argv]
    if argv[:1] == ["run"] and {"-h", "--help"} & set(argv[1:2]):
        # torchtune's help for `run` exits from argparse; ours follows it.
        try:
            torchtune_main()
        except SystemExit as done:
            sys.stdout.flush()
            print(run_help())
            sys.exit(done.code)
    sys.exit(torchtune_main())


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"] and not ({"-h", "--help"} & set(argv[1:2])):
        from kubetune.entrypoints.step import run_step
        from kubetune.entrypoints.train import run_tune

        dry_run = "--kubetune-dry-run" in argv
        argv = [a for a in argv if a != "--kubetune-dry-run"]
        sys.exit(run_step("trainer", lambda: run_tune(argv[1:], dry_run=dry_run)))
    if argv[:1] == ["--kubetune-version"]:
        from kubetune import __version__

        print(f"kubetune {__version__}")
        return
    torchtune_cli(argv)


if __name__ == "__main__":
    main()
