"""The interface every storage source implements."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from initializers.request import InitRequest


@dataclass(frozen=True)
class RemoteFile:
    path: str  # relative path inside the output tree, POSIX separators
    size: int | None = None
    sha256: str | None = None  # when the source knows it, checked after download
    etag: str | None = None


class Source(Protocol):
    def __init__(self, request: InitRequest) -> None: ...

    def resolved_revision(self) -> str | None:
        """The immutable version that was listed (a commit, a version id), if any."""

    def list_files(self) -> list[RemoteFile]:
        """Every file to fetch, already narrowed by the request's sub-path and patterns."""

    def fetch(self, remote: RemoteFile, destination: Path) -> None:
        """Write ``remote`` to ``destination`` (whose parent exists)."""
