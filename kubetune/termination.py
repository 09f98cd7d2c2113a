"""The one-line failure report: stderr plus the Kubernetes termination log."""

from __future__ import annotations

import os
import sys

from kubetune import env
from kubetune.redact import redact


def termination_log_path() -> str:
    # Read at the moment of failure, not at start: a settings object parsed earlier might
    # be what failed.
    return os.environ.get(env.TERMINATION_LOG) or env.DEFAULT_TERMINATION_LOG


def report_failure(message: str) -> None:
    """Print ``message`` to stderr and write it to the termination log.

    The termination log is skipped silently when it cannot be written (a local run, a
    read-only path): the stderr line is then the report; and the reverse.
    """
    line = redact(" ".join(message.split()))
    try:
        print(f"error: {line}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass  # stderr gone (a closed terminal, a closed pipe): the log still gets the line
    write_termination_log(line)


def write_termination_log(message: str) -> None:
    """Write ``message`` (one line, redacted) to the termination log only; skipped silently
    when it cannot be written."""
    line = redact(" ".join(message.split()))
    try:
        with open(termination_log_path(), "w", encoding="utf-8") as log:
            log.write(line + "\n")
    except OSError:
        pass
