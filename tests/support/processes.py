"""The processes a test's run left on this machine, found by a path in their command line
(a run's work directory is in every step's): what a user would see in `ps`."""

from __future__ import annotations

import os
import time
from pathlib import Path


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    """(pid, command line) of every process but this one whose command line has ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text in cmdline and state != "Z":  # a zombie is dead, only not yet reaped
            found.append((int(entry.name), cmdline))
    return found


def assert_no_orphans(workdir: Path) -> None:
    """No process of the run in ``workdir`` is left."""
    # Those killed with their parent die a moment later; give the kernel that moment.
    for _ in range(50):
        left = processes_mentioning(str(workdir))
        if not left:
            return
        time.sleep(0.1)
    raise AssertionError(f"processes left running: {left}")
