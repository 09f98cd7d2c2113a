"""Write a file so that a reader (another step, a restarted pod) sees the old content or
the new, never a part: write a temporary file beside the target, fsync it, rename it over
the target, fsync the directory. Without the two fsyncs a node crash after the rename can
leave an empty or truncated file under the final name, which the next run would trust.

One helper, one durability level, for everything another step or a restart reads.

The file gets the mode the umask gives any new file (0644 under umask 022, 0664 under 002),
as `open()` would give it: a temporary file from `mkstemp` is 0600, and writers that
replace the file they are given (safetensors' `save_file` writes its own 0600 file and
renames it) would otherwise leave the result readable by its owner only, so a serving pod
or a step running as another uid could not read it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator


def umask_mode(*, executable: bool = False) -> int:
    """The mode a new file gets under this process's umask: 0o666 (0o777 for an
    executable or a directory) less the umask."""
    return (0o777 if executable else 0o666) & ~_umask()


def _umask() -> int:
    # Linux reports it without changing it (/proc/self/status, Linux 4.7+); setting it to
    # read it back is the only other way, and is seen by every thread in between.
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    current = os.umask(0o022)
    os.umask(current)
    return current


def fsync_path(path: Path | str) -> None:
    """Flush a file's or a directory's entries to the disk (a rename is durable only then)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: Path | str, *, executable: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` for a writer that wants a file name (a plot
    library, a serializer); on success it becomes ``path`` durably, with the umask's mode
    (``umask_mode``), whatever mode the writer left; on failure it is gone."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, umask_mode(executable=executable))
        fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_path(path.parent)


def write_atomic(path: Path | str, data: str | bytes, *, executable: bool = False) -> None:
    """Replace ``path``'s content with ``data`` (text is written as UTF-8), durably."""
    with atomic_path(path, executable=executable) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
