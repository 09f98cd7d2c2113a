"""Typed errors and the exit codes they map to.

Each error carries one actionable line for the user. The exit code tells a JobSet /
Job failure policy whether a restart can help:

====  ==================  ==========================================================
code  name                meaning
====  ==================  ==========================================================
0     OK                  the step finished
2     USAGE               a CLI option or argument is malformed (click's own code)
65    BAD_INPUT           the request cannot succeed as given: do not restart
70    INTERNAL            a bug in kubetune or a dependency: report it
75    TRANSIENT           a temporary failure outlasted its retries: restart may help
76    KILLED              the training process was killed by a signal (9: likely the
                          out-of-memory killer): restart resumes from the last checkpoint
====  ==================  ==========================================================

The codes come from BSD ``sysexits.h`` (EX_DATAERR, EX_SOFTWARE, EX_TEMPFAIL) so they
cannot be confused with a Python traceback (1) or a signal (128+n).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_BAD_INPUT = 65
EXIT_INTERNAL = 70
EXIT_TRANSIENT = 75
EXIT_KILLED = 76


class KubetuneError(Exception):
    """Base of every error a user can cause or act on; its message is one line."""

    exit_code: int = EXIT_INTERNAL

    def __init__(self, message: str) -> None:
        # One line, always: the message lands in the Kubernetes termination log,
        # which `kubectl describe` shows as a single field.
        super().__init__(" ".join(str(message).split()))

    @property
    def message(self) -> str:
        return str(self)


class BadInputError(KubetuneError):
    """The request is wrong (missing path, bad URI, unreadable model): restarting won't help."""

    exit_code = EXIT_BAD_INPUT


class TransientError(KubetuneError):
    """A temporary failure (network, server) that outlasted its retries: a restart may help."""

    exit_code = EXIT_TRANSIENT


class KilledError(KubetuneError):
    """A child process was killed by a signal (often the OOM killer): a restart resumes."""

    exit_code = EXIT_KILLED


class StepFailedError(KubetuneError):
    """A pipeline step (a child process) failed; carries that step's own exit code."""

    def __init__(self, step: str, cause: str, exit_code: int) -> None:
        super().__init__(f"{step}: {cause}")
        self.step = step
        self.exit_code = exit_code
