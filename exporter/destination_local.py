"""A local destination (a PVC path): built beside it, then swapped in by rename."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from exporter import manifest as export_manifest
from initializers import staging
from kubetune.errors import BadInputError
from kubetune.workspace import EXPORT_MANIFEST_NAME


class LocalDestination:
    def __init__(self, uri: str) -> None:
        path = uri[len("file://"):] if uri.startswith("file://") else uri
        if not path.startswith("/"):
            raise BadInputError(f"export destination {uri!r} must be an absolute path or "
                                "file:///abs/path")
        self.path = Path(path)
        self.description = str(self.path)

    def check(self) -> None:
        if self.path.exists() and not self.path.is_dir():
            raise BadInputError(f"export destination {self.path} is a file: name a directory")
        # A fresh volume's root holds lost+found; that is still an empty destination.
        foreign = [p for p in self.path.iterdir() if p.name != "lost+found"] \
            if self.path.is_dir() else []
        if foreign and not (self.path / EXPORT_MANIFEST_NAME).is_file():
            # Publishing replaces the directory whole: never over something that is not ours.
            raise BadInputError(f"export destination {self.path} holds files that are not a "
                                "kubetune export: choose a new or empty directory")

    def build_dir(self) -> Path:
        staged = staging.staging_dir_for(self.path)
        try:
            if staged.exists():
                shutil.rmtree(staged)
            staged.mkdir(parents=True)
        except OSError as exc:
            raise BadInputError(f"export destination {self.path} is not writable: "
                                f"{exc.strerror}") from None
        return staged

    def read_manifest(self) -> dict | None:
        try:
            found = json.loads((self.path / EXPORT_MANIFEST_NAME).read_text())
        except (OSError, ValueError):
            return None
        for entry in found.get("files", []) if isinstance(found, dict) else []:
            path = self.path / entry["path"]
            if not path.is_file() or path.stat().st_size != entry["size"]:
                return None  # damaged since it was written: export again
        return found

    def publish(self, tree: Path, manifest: dict, previous: dict | None) -> None:
        export_manifest.write(tree, manifest)
        # What a reader will load is what is on disk now: hash it from there.
        export_manifest.check_tree(tree, json.loads((tree / EXPORT_MANIFEST_NAME).read_text()))
        try:
            staging.commit(tree, self.path)
        except OSError as exc:
            raise BadInputError(f"cannot move the export into {self.path}: "
                                f"{exc.strerror}") from None

    def discard(self, tree: Path) -> None:
        shutil.rmtree(tree, ignore_errors=True)
