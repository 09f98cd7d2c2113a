"""Write a source's byte stream into a file, hashing it on the way, resuming a prefix."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from kubetune.initializers.checksums import Hasher, Verified, hash_into
from kubetune.initializers.sources.base import ProgressCallback, RemoteFile
from kubetune.retry import TransientFailure


def write_stream(chunks: Iterable[bytes | memoryview], destination: Path, remote: RemoteFile,
                 hasher: Hasher, have: int = 0,
                 progress: ProgressCallback | None = None) -> Verified:
    """Put ``chunks`` after the first ``have`` bytes of ``destination`` (0: a new file).

    The kept prefix is hashed from disk first, so the result covers the whole file; a
    stream that ends short raises TransientFailure (the next attempt resumes from what
    came), any checksum that differs ChecksumMismatch.
    """
    if have:
        hash_into(hasher, destination, limit=have)
        if progress:
            progress(0)  # the prefix took a while: honour a cancellation before going on
    with open(destination, "r+b" if have else "wb") as out:
        out.seek(have)
        out.truncate()
        for chunk in chunks:
            out.write(chunk)
            hasher.update(chunk)
            if progress:
                progress(len(chunk))
    if remote.size is not None and hasher.size < remote.size:
        raise TransientFailure(f"{remote.path}: the body ended after {hasher.size} of "
                               f"{remote.size} bytes")
    return hasher.verified()
