"""Write a file so that a reader (another step, a restarted pod) sees the old content or
the new, never a part: write a temporary file beside the target, fsync it, rename it over
the target, fsync the directory. Without the two fsyncs a node crash after the rename can
leave an empty or truncated file under the final name, which the next run would trust.

One helper, one durability level, for everything another step or a restart reads.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator


def fsync_path(path: Path | str) -> None:
    """Flush a file's or a directory's entries to the disk (a rename is durable only then)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: Path | str, *, mode: int | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` for a writer that wants a file name (a plot
    library, a serializer); on success it becomes ``path`` durably, on failure it is gone."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        if mode is not None:
            os.chmod(tmp, mode)
        fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_path(path.parent)


def write_atomic(path: Path | str, data: str | bytes, *, mode: int | None = None) -> None:
    """Replace ``path``'s content with ``data`` (text is written as UTF-8), durably."""
    with atomic_path(path, mode=mode) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
