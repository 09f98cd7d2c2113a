"""A local destination (a PVC path): staged beside it, then swapped in by rename."""

from __future__ import annotations

import shutil
from pathlib import Path

from initializers import staging
from kubetune.errors import BadInputError


class LocalDestination:
    def __init__(self, uri: str) -> None:
        path = uri[len("file://"):] if uri.startswith("file://") else uri
        if not path.startswith("/"):
            raise BadInputError(f"export destination {uri!r} must be an absolute path or "
                                "file:///abs/path")
        self.path = Path(path)

    def stage(self) -> Path:
        staged = staging.staging_dir_for(self.path)
        try:
            if staged.exists():
                shutil.rmtree(staged)
            staged.mkdir(parents=True)
        except OSError as exc:
            raise BadInputError(f"export destination {self.path} is not writable: "
                                f"{exc.strerror}") from None
        return staged

    def commit(self, staged: Path) -> None:
        staging.commit(staged, self.path)
