"""``tar:///abs/path/archive.tar[.gz|.bz2|.xz]``: files from one archive on a mounted volume.

A worked example of a kubetune storage scheme. kubetune does the rest for every scheme:
staging, parallel fetch, retries (raise `kubetune.retry.TransientFailure`), size and
checksum verification, refusing names that escape OUTPUT_PATH, the manifest, the swap.
"""

from __future__ import annotations

import hashlib
import shutil
import tarfile
import threading
from pathlib import Path

from kubetune.initializers.filters import keep
from kubetune.initializers.request import InitRequest
from kubetune.initializers.sources.base import ProgressCallback, RemoteFile, mounted_path
from kubetune.errors import BadInputError

CHUNK = 1024 * 1024


class TarSource:
    def __init__(self, request: InitRequest) -> None:
        self.request = request
        self.archive = mounted_path(request, "archive", Path.is_file)
        try:
            with tarfile.open(self.archive) as tar:
                self.members = {m.name: m for m in tar.getmembers()}
        except tarfile.TarError as exc:
            raise BadInputError(f"{self.archive} is not a readable tar archive: {exc}") from None
        # kubetune fetches files from several threads; a TarFile is not thread-safe.
        self._local = threading.local()

    def resolved_revision(self) -> str | None:
        digest = hashlib.sha256()
        with open(self.archive, "rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
        return f"sha256:{digest.hexdigest()}"

    def list_files(self) -> list[RemoteFile]:
        # Only regular files: links and devices in an archive are never followed.
        return [RemoteFile(path=name.removeprefix("./"), size=m.size, key=name)
                for name, m in sorted(self.members.items())
                if m.isfile() and keep(name.removeprefix("./"), self.request.allow_patterns,
                                       self.request.ignore_patterns)]

    def fetch(self, remote: RemoteFile, destination: Path,
              progress: ProgressCallback | None = None) -> None:
        tar = getattr(self._local, "tar", None)
        if tar is None:
            tar = self._local.tar = tarfile.open(self.archive)
        source = tar.extractfile(self.members[remote.key])
        with source, open(destination, "wb") as out:
            while chunk := source.read(CHUNK):
                out.write(chunk)
                if progress:
                    progress(len(chunk))
