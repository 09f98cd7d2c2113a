"""What brings a stopped step back, in the words of where it runs.

In a pod, the failure policy restarts a step that exits 75: its line says what that
restart does. Under `kubetune local` (which sets ``KUBETUNE_LOCAL_RUN`` for every step it
starts) a stop comes from the user, and nothing restarts after it: the user runs the same
command again.
"""

from __future__ import annotations

import os
from typing import Mapping

from kubetune import env


def restart_advice(resumes: bool, environ: Mapping[str, str] | None = None) -> str:
    """The end of a stopped step's line: how its work goes on (``resumes``: from a
    checkpoint it saved; else from the start)."""
    # A child of `kubetune local` or a pod's process: the variable `steps.py` sets.
    local = bool((os.environ if environ is None else environ).get(env.LOCAL_RUN))
    if local:
        return "run the same command to resume" if resumes else \
            "run the same command to run it again"
    return "a restart with the same config resumes from it" if resumes else \
        "a restart runs it again"
