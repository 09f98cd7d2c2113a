"""The `kubetune` command line: one subcommand per step.

Each step is also an importable function (``run_init_dataset``, ``run_train`` ...) so a
runtime author can wrap it in their own entrypoint.
"""
