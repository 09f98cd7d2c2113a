"""The `kubetune` command line: one subcommand per step.

Each step is also an importable function so a runtime author can wrap it in their own
entrypoint: ``init_storage.run_init`` (both initializers), ``train.run_train`` and
``train.run_tune``, ``export.run_export``, ``local.run_local`` / ``local.run_runtime``
(each reads its step's variables as the command does: docs/extending.md, "Wrap points").
``validate`` checks a runtime and a TrainJob offline.
"""

# First of all, before the heavy imports: a SIGTERM while starting still leaves a line.
from kubetune.entrypoints import early_sigterm as _early_sigterm  # noqa: E402

_early_sigterm.install()
