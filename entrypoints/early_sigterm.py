"""A SIGTERM before a step has set up its own handling still leaves its one line.

Python's default for SIGTERM ends the process at once, with nothing on stderr and nothing
in the termination log: a pod evicted while a step is still importing torch or planning
would be a silent exit 143. This handler, installed as the entrypoints package is first
imported (before the heavy imports), writes the step's line to stderr and the termination
log and exits with the transient code (75: a restart runs the step again). Steps that
handle SIGTERM themselves (the trainer while its recipe runs: a resumable save) replace it
for that time and put it back after.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from kubetune.errors import EXIT_TRANSIENT
from kubetune.restart_advice import restart_advice
from kubetune.termination import report_failure, write_termination_log

# `kubetune <command>` -> the step name its lines carry (entrypoints/step.py's names).
_STEP_OF_COMMAND = {"init-model": "model-initializer", "init-dataset": "dataset-initializer",
                    "train": "trainer", "export": "exporter", "local": "local",
                    "install-tune": "install-tune"}
_step = "kubetune"


def _step_from_argv(argv: list[str]) -> str:
    program = os.path.basename(argv[0]) if argv else ""
    if program in ("tune", "tune.py") or (len(argv) > 1 and argv[1] == "run"):
        return "trainer"
    for arg in argv[1:]:
        if arg in _STEP_OF_COMMAND:
            return _STEP_OF_COMMAND[arg]
    return "kubetune"


def _on_sigterm(signum: int, frame) -> None:
    line = f"{_step}: stopped by SIGTERM before it finished: {restart_advice(resumes=False)}"
    try:
        report_failure(line)
    except Exception:  # stderr busy in the frame we interrupted: the log is what counts
        write_termination_log(line)
    os._exit(EXIT_TRANSIENT)  # at once, as the default action would: no cleanup to wait on


def install(step: str | None = None) -> None:
    """Handle SIGTERM as above for ``step`` (named from the command line when None)."""
    global _step
    _step = step or _step_from_argv(sys.argv)
    if threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, _on_sigterm):
        signal.signal(signal.SIGTERM, _on_sigterm)
