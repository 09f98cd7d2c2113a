"""What the launcher reads from its environment, in one place: the ``PET_*`` variables the
torch plugin of Kubeflow Trainer sets (``topology`` turns them into nodes and processes;
torchrun options win over them), the SIGTERM grace period and the step-level save cadence
and where the token cache lives (the merged config's ``kubetune`` section wins over them).

Each value is parsed when first asked for and kept: what an option or the config already
decides is never read, so a stray value there is not refused."""

from __future__ import annotations

import os
from functools import cached_property
from typing import Mapping

from kubetune import env
from kubetune.env_numbers import env_float, env_int

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

    @cached_property
    def grace_period_s(self) -> float:
        """Seconds from SIGTERM to the checkpoint deadline."""
        return env_float(env.GRACE_PERIOD_S, DEFAULT_GRACE_PERIOD_S, 0, self._environ)

    @cached_property
    def save_every_n_steps(self) -> int:
        """Steps between two resumable saves (0: per epoch)."""
        return env_int(env.SAVE_EVERY_N_STEPS, DEFAULT_SAVE_EVERY_N_STEPS, 0, self._environ)

    @cached_property
    def token_cache_dir(self) -> str | None:
        """Where tokenized datasets are cached; None: the workspace's place for them."""
        return self._environ.get(env.TOKEN_CACHE_DIR) or None
