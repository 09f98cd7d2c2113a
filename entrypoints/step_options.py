"""Our steps' click options, handed to the checks below this room that read settings as
the steps will (`kubetune.tools.local.settings_check`): the trainer's, the exporter's and
the initializers' commands, each imported without the torch stack."""

from __future__ import annotations

from kubetune.tools.local.settings_check import SettingsCheck, step_options


def settings_check() -> SettingsCheck:
    """The settings check over every step's options (`kubetune train` first)."""
    from kubetune.entrypoints.export import export_command
    from kubetune.entrypoints.init_storage import init_dataset, init_model
    from kubetune.entrypoints.train import train

    return SettingsCheck(step_options(train, export_command, init_dataset, init_model),
                         trainer=train.name)
