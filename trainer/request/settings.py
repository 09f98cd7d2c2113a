"""What the launcher reads from its environment, in one place: the ``PET_*`` variables the
torch plugin of Kubeflow Trainer sets (``topology`` turns them into nodes and processes;
torchrun options win over them).

The trainer's own settings (``KUBETUNE_EPOCHS``, the SIGTERM grace period, the step-level
save cadence, ...) are `kubetune train`'s options, read from their variables by those
options on every path (``kubetune.entrypoints.train.environment_settings``) and handed to
the plan as overrides."""

from __future__ import annotations

import os
from typing import Mapping

DEFAULT_GRACE_PERIOD_S = 30.0
DEFAULT_SAVE_EVERY_N_STEPS = 0  # a resumable save per epoch only


class LauncherSettings:
    """``environ``: the variables to read (default: this process's)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = os.environ if environ is None else environ  # the pod spec's values

    def pet(self, variable: str) -> str | None:
        """A ``PET_*`` value as the plugin set it, unparsed (``topology`` checks it against
        the torchrun option of the same meaning, and names whichever it took); None: unset."""
        return self._environ.get(variable) or None
