"""A local destination (a PVC path): built beside it, then swapped in by rename.

When the path is itself a mount point (a PVC mounted at EXPORT_URI), it cannot be renamed
over and its parent is another volume: the export is built in a hidden directory inside
it, and its entries replace the old export's, the manifest removed first and moved in last.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from kubetune.exporter import manifest as export_manifest
from kubetune import staging
from kubetune.errors import BadInputError
from kubetune.storage_uri import FileUri
from kubetune.workspace import EXPORT_MANIFEST_NAME, STAGING_PREFIX

# A fresh volume's root holds lost+found; that is still an empty destination.
_VOLUME_ENTRIES = ("lost+found",)


class LocalDestination:
    def __init__(self, where: FileUri) -> None:
        self.path = where.path
        self.description = str(self.path)

    def check(self) -> None:
        if self.path.exists() and not self.path.is_dir():
            raise BadInputError(f"export destination {self.path} is a file: name a directory")
        foreign = [p for p in self.path.iterdir() if p.name not in _VOLUME_ENTRIES
                   and not p.name.startswith(STAGING_PREFIX)] if self.path.is_dir() else []
        if foreign and not (self.path / EXPORT_MANIFEST_NAME).is_file():
            # Publishing replaces the directory whole: never over something that is not ours.
            raise BadInputError(f"export destination {self.path} holds files that are not a "
                                "kubetune export: choose a new or empty directory")

    def _is_mount(self) -> bool:
        return staging.is_mount_point(self.path)  # a subPath bind mount included

    def build_dir(self) -> Path:
        staged = (self.path / f"{STAGING_PREFIX}export" if self._is_mount()
                  else staging.staging_dir_for(self.path))
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
            if self._is_mount():
                self._commit_into_mount(tree)
            else:
                staging.commit(tree, self.path)
        except OSError as exc:
            raise BadInputError(f"cannot move the export into {self.path}: "
                                f"{exc.strerror}") from None

    def _commit_into_mount(self, tree: Path) -> None:
        # check() made sure everything here is an earlier export (or the volume's own).
        (self.path / EXPORT_MANIFEST_NAME).unlink(missing_ok=True)  # readers gate on it
        for child in self.path.iterdir():
            if child == tree or child.name in _VOLUME_ENTRIES:
                continue
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        for child in sorted(tree.iterdir(), key=lambda p: p.name == EXPORT_MANIFEST_NAME):
            os.replace(child, self.path / child.name)
        tree.rmdir()

    def discard(self, tree: Path) -> None:
        shutil.rmtree(tree, ignore_errors=True)
