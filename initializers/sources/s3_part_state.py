"""Which ranged parts of an S3 object are whole on disk, recorded beside its ``*.part``.

A pod killed in the middle of a 10 GB object leaves most of it written: this record lets
the next run fetch only the parts still missing. It is trusted only for the same object
version (key, ETag, size), and only where the ETag checks the whole file afterwards, so a
record that outlived its bytes (a node crash that lost the page cache) costs a restart,
never a bad file.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from kubetune.initializers.sources.base import RemoteFile


class PartState:
    def __init__(self, path: Path, remote: RemoteFile, size: int) -> None:
        self.path = path
        self._version = {"key": remote.key, "etag": remote.etag, "size": size}
        self._lock = threading.Lock()

    def recorded(self, ranges: list[tuple[int, int]]) -> set[int]:
        """The starts of the parts of ``ranges`` recorded whole for this version."""
        try:
            lines = self.path.read_text().splitlines()
            if not lines or json.loads(lines[0]) != self._version:
                return set()
        except (OSError, ValueError):
            return set()
        wanted, starts = set(ranges), set()
        for line in lines[1:]:
            try:
                start, end = (int(n) for n in line.split())
            except ValueError:
                continue  # the line the kill cut off
            if (start, end) in wanted:
                starts.add(start)
        return starts

    def begin(self) -> None:
        self.path.write_text(json.dumps(self._version) + "\n")

    def record(self, start: int, end: int) -> None:
        """Called once the part's bytes are written (a killed process keeps them: they are
        in the page cache)."""
        with self._lock, open(self.path, "a") as out:
            out.write(f"{start} {end}\n")
