"""Copy a user's file into our workspace without ever sharing its inode.

A hard link would make the workspace's file the user's file: a step (or a person) editing
one edits the other. A reflink (``FICLONE``: btrfs, XFS, bcachefs) shares only the blocks,
copy-on-write, and costs no space; ``copy_file_range`` lets the kernel copy (server-side on
NFS, a reflink where the filesystem offers one); a plain copy works everywhere else.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
from pathlib import Path

_FICLONE = 0x40049409  # _IOW(0x94, 9, int), linux/fs.h
# What a filesystem or kernel without the faster way answers: fall back, it is no failure.
_UNSUPPORTED = {errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EINVAL, errno.ENOSYS,
                errno.ENOTTY, errno.EBADF, errno.EPERM}


def copy_file(source: Path, destination: Path) -> None:
    """``destination`` gets ``source``'s bytes in a new inode of its own."""
    with open(source, "rb") as src, open(destination, "wb") as dst:
        try:
            fcntl.ioctl(dst.fileno(), _FICLONE, src.fileno())
            return
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:
                raise
        if _copy_in_kernel(src.fileno(), dst.fileno(), os.fstat(src.fileno()).st_size):
            return
        src.seek(0)
        dst.seek(0)
        dst.truncate()
        shutil.copyfileobj(src, dst, 1 << 20)


def _copy_in_kernel(src: int, dst: int, size: int) -> bool:
    copy_range = getattr(os, "copy_file_range", None)
    if copy_range is None:
        return False
    done = 0
    try:
        while done < size:
            moved = copy_range(src, dst, size - done, done, done)
            if moved == 0:
                break  # the source shrank under us: the caller's checksum will tell
            done += moved
    except OSError as exc:
        if exc.errno not in _UNSUPPORTED or done:
            raise
        return False
    return True
