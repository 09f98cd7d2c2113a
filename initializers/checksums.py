"""Check a downloaded file against every checksum its source published.

Sources that see the bytes in order (a stream, or ranged parts taken in order as they
land) hash them on the way with `Hasher` and hand back the result, which saves reading
the file a second time; for the rest, `verify` reads it once for all checksums.
"""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kubetune.initializers.sources.base import RemoteFile

CHUNK = 4 * 1024 * 1024
# Below this a chunk is hashed inline: handing it to another thread costs more than it saves.
PARALLEL_MIN = 256 * 1024

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _digest_pool() -> ThreadPoolExecutor:
    # hashlib releases the GIL on large updates, so a second digest of the same chunk runs
    # on another core; one pool for the process keeps the thread count fixed however many
    # files are hashed at once.
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=max(1, (os.cpu_count() or 1)),
                                       thread_name_prefix="digest")
        return _pool


@dataclass(frozen=True)
class Verified:
    sha256: str
    checked: tuple[str, ...]  # which source checksums matched ("sha256", "md5", ...)


class ChecksumMismatch(Exception):
    """The bytes on disk differ from what the source says the file holds."""

    def __init__(self, message: str, check: str = "size") -> None:
        super().__init__(message)
        self.check = check  # which one failed: "size", "sha256", "md5", ...


class MultipartMD5:
    """S3's ETag of a multipart upload: the MD5 of its parts' MD5s, then "-<part count>"."""

    def __init__(self, part_sizes: tuple[int, ...]) -> None:
        self._sizes = iter(part_sizes)
        self._left = next(self._sizes, 0)
        self._done: list[bytes] = []
        self._part = hashlib.md5(usedforsecurity=False)

    def update(self, chunk: bytes | memoryview) -> None:
        view = memoryview(chunk)
        while len(view):
            if not self._left:  # more bytes than the parts hold: the size check says so
                return
            take = min(len(view), self._left)
            self._part.update(view[:take])
            self._left -= take
            view = view[take:]
            if not self._left:
                self._done.append(self._part.digest())
                self._part = hashlib.md5(usedforsecurity=False)
                self._left = next(self._sizes, 0)

    def hexdigest(self) -> str:
        return (f"{hashlib.md5(b''.join(self._done), usedforsecurity=False).hexdigest()}"
                f"-{len(self._done)}")


class Hasher:
    """sha256 (for the manifest) plus whichever checksums ``remote`` publishes."""

    def __init__(self, remote: RemoteFile) -> None:
        self.remote = remote
        self.size = 0
        self._sha256 = hashlib.sha256()
        # git's blob id hashes a header then the content: the size must be known upfront.
        self._git = (hashlib.sha1(f"blob {remote.size}\0".encode())
                     if remote.git_sha1 and remote.size is not None else None)
        self._md5 = hashlib.md5(usedforsecurity=False) if remote.md5 else None
        self._parts = (MultipartMD5(remote.part_sizes)
                       if remote.multipart_etag and remote.part_sizes else None)

    def update(self, chunk: bytes | memoryview) -> None:
        """Feed every digest ``chunk``; returns once all are done with it, so the caller may
        reuse its buffer."""
        self.size += len(chunk)
        others = [d for d in (self._md5, self._parts, self._git) if d is not None]
        if not others or len(chunk) < PARALLEL_MIN or (os.cpu_count() or 1) < 2:
            for digest in (self._sha256, *others):
                digest.update(chunk)
            return
        # MD5 is about three times slower than sha256 here: each extra digest takes its own
        # core, and the chunk costs the slowest digest instead of the sum of all.
        pending = [_digest_pool().submit(digest.update, chunk) for digest in others]
        self._sha256.update(chunk)
        for future in pending:
            future.result()

    def verified(self) -> Verified:
        """The result, or ChecksumMismatch if the size or any published checksum differs."""
        remote = self.remote
        if remote.size is not None and self.size != remote.size:
            raise ChecksumMismatch(f"{remote.path}: got {self.size} bytes, the source lists "
                                   f"{remote.size}")
        checked = []
        for name, expected, digest in (("sha256", remote.sha256, self._sha256),
                                       ("git-sha1", remote.git_sha1, self._git),
                                       ("md5", remote.md5, self._md5),
                                       ("multipart etag", remote.multipart_etag, self._parts)):
            if expected and digest is not None:
                if digest.hexdigest() != expected.lower():
                    raise ChecksumMismatch(f"{remote.path}: {name} differs from the source's "
                                           "checksum", check=name)
                checked.append(name)
        return Verified(sha256=self._sha256.hexdigest(), checked=tuple(checked))


def hash_into(hasher: Hasher, path: Path, limit: int | None = None) -> None:
    """Feed ``hasher`` the first ``limit`` bytes of ``path`` (all of it when None)."""
    left = limit
    # One reused buffer: a fresh multi-MB bytes per read costs a page fault per 4 KiB.
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while left is None or left > 0:
            n = f.readinto(view if left is None else view[:min(CHUNK, left)])
            if not n:
                break
            hasher.update(view[:n])
            if left is not None:
                left -= n


def verify(path: Path, remote: RemoteFile) -> Verified:
    """sha256 of ``path`` (for the manifest); raise ChecksumMismatch on any published mismatch."""
    size = path.stat().st_size
    if remote.size is not None and size != remote.size:
        raise ChecksumMismatch(f"{remote.path}: got {size} bytes, the source lists {remote.size}")
    hasher = Hasher(remote)
    hash_into(hasher, path)
    return hasher.verified()
