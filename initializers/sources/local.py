"""``file://`` and absolute paths: an already-mounted volume (a PVC, a hostPath)."""

from __future__ import annotations

import os
from pathlib import Path

from kubetune.initializers.copy_file import copy_file
from kubetune.initializers.filters import keep
from kubetune.initializers.request import InitRequest
from kubetune.initializers.sources.base import RemoteFile, mounted_path
from kubetune.errors import BadInputError


class LocalSource:
    def __init__(self, request: InitRequest) -> None:
        self.request = request
        self.root = mounted_path(request, f"{request.kind} source")
        if not os.access(self.root, os.R_OK):
            raise BadInputError(f"{request.kind} source {self.root} is not readable")

    def resolved_revision(self) -> str | None:
        return None

    def list_files(self) -> list[RemoteFile]:
        if self.root.is_file():
            return [_listed(self.root.name, self.root)]
        files = []
        for path in sorted(self.root.rglob("*")):
            if path.is_symlink() and not path.resolve().is_relative_to(self.root.resolve()):
                continue  # never follow a link out of the source tree
            if not path.is_file():
                continue
            rel = path.relative_to(self.root).as_posix()
            if rel.startswith(".kubetune") or "/.kubetune" in rel:
                continue  # our own bookkeeping from a tree that was itself initialized
            if keep(rel, self.request.allow_patterns, self.request.ignore_patterns):
                files.append(_listed(rel, path))
        return files

    def local_path(self, remote: RemoteFile) -> Path:
        """Where the listed ``remote`` is on the volume (read in place to tell an edit)."""
        return self.root if self.root.is_file() else self.root / remote.path

    def fetch(self, remote: RemoteFile, destination: Path) -> None:
        # Never a hard link: the output would be the user's file, and editing one edits both.
        copy_file(self.local_path(remote), destination)


def _listed(rel: str, path: Path) -> RemoteFile:
    stat = path.stat()
    return RemoteFile(path=rel, size=stat.st_size, mtime_ns=stat.st_mtime_ns)
