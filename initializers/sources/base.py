"""The interface every storage source implements."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from kubetune.errors import BadInputError
from kubetune.initializers.request import InitRequest

# Called with the number of bytes just written; it raises to cancel a transfer early
# (another file failed for good), so a source must let its exceptions propagate.
ProgressCallback = Callable[[int], None]


@dataclass(frozen=True)
class RemoteFile:
    path: str  # relative path inside the output tree, POSIX separators
    size: int | None = None
    sha256: str | None = None  # when the source knows it, checked after download
    etag: str | None = None  # the source's version tag (S3 ETag), to detect a changed object
    git_sha1: str | None = None  # git blob id (the hub's id for non-LFS files)
    md5: str | None = None  # S3 single-part ETag: the MD5 of the content
    # S3 multipart ETag, "<MD5 of the parts' MD5s>-<part count>": checkable once the
    # upload's part sizes are known.
    multipart_etag: str | None = None
    part_sizes: tuple[int, ...] | None = None
    key: str | None = None  # where the source finds it, when that differs from ``path``
    # A mounted source's modification time (ns): recorded in the manifest, so that a rerun
    # tells a file edited in place from one untouched by a stat (`source_change`).
    mtime_ns: int | None = None


def mounted_path(request: InitRequest, what: str,
                 present: Callable[[Path], bool] = Path.exists) -> Path:
    """The path ``request``'s URI names on a mounted volume (``file://``, a plugin's
    ``tar://``); one line naming ``what`` when it is not there (``present`` says)."""
    path = Path(request.uri.location)
    if not present(path):
        raise BadInputError(f"{what} {path} does not exist")
    return path


class Source(Protocol):
    def __init__(self, request: InitRequest) -> None: ...

    def resolved_revision(self) -> str | None:
        """The immutable version that was listed (a commit, a version id), if any."""

    def list_files(self) -> list[RemoteFile]:
        """Every file to fetch, already narrowed by the request's sub-path and patterns."""

    def fetch(self, remote: RemoteFile, destination: Path,
              progress: ProgressCallback | None = None):
        """Write ``remote`` to ``destination`` (whose parent exists).

        Returns None (kubetune then reads the file back to check it against ``remote``),
        ``remote`` amended with what the transfer taught (a checksum that turned out not
        to apply), or the `kubetune.initializers.checksums.Verified` of a `Hasher` the source fed
        the bytes as it wrote them (raising its ChecksumMismatch), which saves that read.

        ``destination`` may hold the start of the file from an interrupted attempt; a
        source that can resume appends to it, any other overwrites it. Raise
        `kubetune.retry.TransientFailure` (or an exception the source's ``classify``
        maps to one) for failures worth another attempt. ``progress`` is optional so
        that sources written before it keep working.
        """

    # Optional: ``plan(files, workers)`` is called once before any fetch with the whole
    # listing in fetch order and the number of files fetched at once, for a source that
    # paces its transfers by them (S3 splits objects into ranged parts only when that adds
    # parallelism).
