"""The one-line failure report: stderr plus the Kubernetes termination log."""

from __future__ import annotations

import os
import sys

from kubetune import env, logs
from kubetune.redact import redact


def termination_log_path() -> str:
    # Read at the moment of failure, not at start: a settings object parsed earlier might
    # be what failed.
    return os.environ.get(env.TERMINATION_LOG) or env.DEFAULT_TERMINATION_LOG


def report_failure(message: str) -> None:
    """Print ``message`` to stderr and write it to the termination log.

    The termination log is skipped silently when it cannot be written (a local run, a
    read-only path): the stderr line is then the report; and the reverse. A stderr that is
    gone falls back to the process's terminal, if it has one.
    """
    line = redact(" ".join(message.split()))
    shown = f"error: {line}"
    if logs.json_mode():  # every line JSON where JSON was asked for, this one too
        shown = logs.json_line(logs.current_step() or "kubetune", "ERROR", line,
                               {"error": True})
    try:
        print(shown, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        # stderr gone: `kubetune local 2>&1 | tee log` whose tee the same Ctrl-C ended.
        _to_terminal(shown)
    write_termination_log(line)


def _to_terminal(text: str) -> None:
    """The user's terminal, when this process has one (a command run in a shell; never a
    pod, nor a step of `kubetune local`, which runs in a session of its own): the line
    reaches the person who stopped the run; skipped silently otherwise."""
    try:
        with open("/dev/tty", "w", encoding="utf-8") as tty:
            tty.write(text + "\n")
    except OSError:
        pass


def write_termination_log(message: str) -> None:
    """Write ``message`` (one line, redacted) to the termination log only; skipped silently
    when it cannot be written."""
    line = redact(" ".join(message.split()))
    try:
        with open(termination_log_path(), "w", encoding="utf-8") as log:
            log.write(line + "\n")
    except OSError:
        pass
