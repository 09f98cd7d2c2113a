"""What a user checks of the files a run wrote: whose they are, and that their modes are
the ones the umask gives (0644/0755 under 022), neither private nor writable by all."""

from __future__ import annotations

import stat
from pathlib import Path

# Written executable on purpose: our `tune` for the steps run as processes.
EXECUTABLES = {"bin/tune", "bin/tune-torchtune"}


def wrong_modes(root: Path, umask: int) -> list[str]:
    """Every path under ``root`` whose permission bits are not the umask's, with both."""
    wrong = []
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            continue
        rel = path.relative_to(root).as_posix()
        full = 0o777 if path.is_dir() or rel in EXECUTABLES else 0o666
        want, got = full & ~umask, stat.S_IMODE(path.stat().st_mode)
        if got != want:
            wrong.append(f"{rel}: {got:04o}, expected {want:04o}")
    return wrong


def wrong_owners(root: Path, uid: int, gid: int) -> list[str]:
    """Every path under ``root`` (itself included) not owned by ``uid``:``gid``."""
    wrong = []
    for path in [root, *sorted(root.rglob("*"))]:
        st = path.lstat()
        if (st.st_uid, st.st_gid) != (uid, gid):
            wrong.append(f"{path.relative_to(root).as_posix() or '.'}: "
                         f"{st.st_uid}:{st.st_gid}")
    return wrong
