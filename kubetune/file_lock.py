"""One process at a time on a directory: an ``flock``'d lock file, with its holder in it.

The lock dies with its process (the kernel drops an ``flock`` when the last descriptor
closes), so a killed pod or a ``kill -9`` never leaves it held: the file it leaves behind
is only a name, and the next run locks it. A clean exit removes the file too (while still
holding it: a waiter that then gets the removed file's lock sees it is no longer the one
at the path, and locks the new one). The descriptor is not inherited by children (Python
opens files non-inheritable), so a step's lock ends with the step, not with what it spawned.

The holder (pid and host) is written into the file once it is held, for the line that
names who holds it; a holder that has just taken the lock may not have written it yet.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from pathlib import Path
from typing import Callable, Iterator


class LockHeld(Exception):
    """The lock is held by another process and the caller would not wait."""

    def __init__(self, path: Path, holder: str) -> None:
        super().__init__(f"{path} is held by {holder}")
        self.path = path
        self.holder = holder


def holder(path: Path) -> str:
    """Who holds the lock at ``path``, as recorded: ``pid N on HOST``, or
    ``another process`` when nothing readable is recorded."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        return f"pid {int(record['pid'])} on {record['host']}"
    except (OSError, ValueError, TypeError, KeyError):
        return "another process"


def _record(handle) -> None:
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}) + "\n")
        handle.flush()
    except OSError:
        pass  # who holds it is a courtesy to the next caller; the flock is the lock


@contextlib.contextmanager
def hold(path: Path, wait: bool = True,
         on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the lock file ``path`` while the block runs.

    Held elsewhere: ``wait`` blocks until it is free (``on_wait`` is told who holds it
    first); otherwise ``LockHeld`` is raised at once, and nothing is changed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        handle = open(path, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                handle.close()
                raise LockHeld(path, holder(path)) from None
            if on_wait is not None:
                on_wait(holder(path))
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(handle.fileno()).st_ino:
            break
        handle.close()  # the holder before us removed it: lock the file at the path now
    try:
        _record(handle)
        yield
    finally:
        path.unlink(missing_ok=True)
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()
