"""A local destination (a PVC path): built beside it, then swapped in by rename.

When the path is itself a mount point (a PVC mounted at EXPORT_URI), it cannot be renamed
over and its parent is another volume: the export is built in a hidden directory inside
it, and its entries replace the old export's, the manifest removed first and moved in last
(``staging.swap_contents``). Only an earlier export's files (its manifest lists them) are
ever replaced: a destination holding anything else is refused before the export starts.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from kubetune.exporter import export_manifest
from kubetune.exporter.build_tree import empty_tree
from kubetune import staging
from kubetune.errors import BadInputError
from kubetune.storage_uri import FileUri
from kubetune.workspace import EXPORT_MANIFEST_NAME, STAGING_PREFIX


class LocalDestination:
    def __init__(self, where: FileUri) -> None:
        self.path = where.path
        self.description = str(self.path)

    def check(self) -> None:
        # Checked first, built and published after: a symlink's target is the destination.
        self.path = staging.follow_link(self.path, "export destination")
        if self.path.exists() and not self.path.is_dir():
            raise BadInputError(f"export destination {self.path} is a file: name a directory")
        # Publishing replaces the earlier export: never anything that is not its.
        foreign = staging.foreign_entries(self.path, EXPORT_MANIFEST_NAME)
        if foreign:
            raise BadInputError(f"export destination {self.path} holds files that are not a "
                                f"kubetune export's ({staging.name_a_few(foreign)}): move them "
                                "away or choose a new or empty directory")

    def _is_mount(self) -> bool:
        return staging.is_mount_point(self.path)  # a subPath bind mount included

    def build_dir(self) -> contextlib.AbstractContextManager[Path]:
        staged = (self.path / f"{STAGING_PREFIX}export" if self._is_mount()
                  else staging.staging_dir_for(self.path))
        return empty_tree(staged, f"export destination {self.path} is not writable")

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
            staging.commit(tree, self.path, EXPORT_MANIFEST_NAME)
        except OSError as exc:
            raise BadInputError(f"cannot move the export into {self.path}: "
                                f"{exc.strerror}") from None
