"""The `kubetune` command line: one subcommand per step.

Each step is also an importable function (``run_init_dataset``, ``run_train`` ...) so a
runtime author can wrap it in their own entrypoint.
"""

# First of all, before the heavy imports: a SIGTERM while starting still leaves a line.
from kubetune.entrypoints import early_sigterm as _early_sigterm  # noqa: E402

_early_sigterm.install()
