"""Every Python process a profiled test session starts, logged: which test started it
(pytest's ``PYTEST_CURRENT_TEST``, inherited by every child), its command line, when it
started and ended, the CPU seconds it used, and whether it imported torch.

Not imported by the suite: `make test-profile` copies this file into the venv's
site-packages with a ``.pth`` line that imports it in every interpreter, and sets
``SUITE_PROCESS_LOG`` (not a ``KUBETUNE_`` name: the tests strip those from their
children) to the log's path; without that variable it does nothing.
``bench/suite_profile.py`` reads the log beside pytest's durations and py-spy's samples.
One ``write`` per line on an ``O_APPEND`` file: lines from concurrent processes do not
interleave.
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import sys
import time

_PATH = os.environ.get("SUITE_PROCESS_LOG")


def _write(record: dict) -> None:
    fd = os.open(_PATH, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def _at_exit() -> None:
    # CPU seconds, not only the wall: under load the wall grows, the CPU a process used
    # does not.
    usage = resource.getrusage(resource.RUSAGE_SELF)
    _write({"pid": os.getpid(), "end": time.time(), "cpu": usage.ru_utime + usage.ru_stime,
            "torch": "torch" in sys.modules, "torchtune": "torchtune" in sys.modules})


def _exit_now(code: int = 0, _exit=os._exit) -> None:
    """os._exit skips atexit: torchrun's workers and our recipe process leave through it."""
    try:
        _at_exit()
    finally:
        _exit(code)


if _PATH:
    # sys.argv is not set yet when a .pth line runs: /proc has the command line.
    try:
        with open(f"/proc/{os.getpid()}/cmdline", "rb") as cmdline:
            argv = [arg.decode(errors="replace") for arg in cmdline.read().split(b"\0") if arg]
    except OSError:
        argv = []
    _write({"pid": os.getpid(), "ppid": os.getppid(), "start": time.time(), "argv": argv[:12],
            "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "")})
    atexit.register(_at_exit)
    os._exit = _exit_now
