"""Check a downloaded file against every checksum its source published, in one read."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from initializers.sources.base import RemoteFile

CHUNK = 4 * 1024 * 1024


@dataclass(frozen=True)
class Verified:
    sha256: str
    checked: tuple[str, ...]  # which source checksums matched ("sha256", "git-sha1", "md5")


class ChecksumMismatch(Exception):
    """The bytes on disk differ from what the source says the file holds."""


def verify(path: Path, remote: RemoteFile) -> Verified:
    """sha256 of ``path`` (for the manifest); raise ChecksumMismatch on any published mismatch."""
    size = path.stat().st_size
    if remote.size is not None and size != remote.size:
        raise ChecksumMismatch(f"{remote.path}: got {size} bytes, the source lists {remote.size}")
    sha256 = hashlib.sha256()
    # git's blob id hashes a header then the content: the hub gives it for non-LFS files.
    git = hashlib.sha1(f"blob {size}\0".encode()) if remote.git_sha1 else None
    md5 = hashlib.md5(usedforsecurity=False) if remote.md5 else None
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            sha256.update(chunk)
            if git:
                git.update(chunk)
            if md5:
                md5.update(chunk)
    checked = []
    for name, expected, digest in (("sha256", remote.sha256, sha256),
                                   ("git-sha1", remote.git_sha1, git),
                                   ("md5", remote.md5, md5)):
        if expected and digest is not None:
            if digest.hexdigest() != expected.lower():
                raise ChecksumMismatch(f"{remote.path}: {name} differs from the source's checksum")
            checked.append(name)
    return Verified(sha256=sha256.hexdigest(), checked=tuple(checked))
