"""Refuse remote names that would land outside the output tree."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from kubetune.errors import BadInputError


def safe_join(root: Path, remote_path: str) -> Path:
    """``root / remote_path``, or BadInputError when the name escapes ``root``."""
    pure = PurePosixPath(remote_path)
    if (not remote_path or pure.is_absolute() or "\\" in remote_path
            or any(part in ("..", "") for part in remote_path.split("/"))
            or remote_path.startswith("~")):
        raise BadInputError(f"refusing remote file name {remote_path!r}: it would land "
                            "outside the output directory")
    target = root.joinpath(*pure.parts)
    resolved_root = root.resolve()
    # A symlink already in the tree must not redirect the write elsewhere.
    if not target.resolve().is_relative_to(resolved_root):
        raise BadInputError(f"refusing remote file name {remote_path!r}: it resolves outside "
                            "the output directory")
    return target
