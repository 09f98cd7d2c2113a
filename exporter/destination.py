"""Where an export goes, chosen by EXPORT_URI's scheme.

Every destination offers the same four steps, so the flow never knows which it has:
``check`` (fail fast on a bad location or credentials), ``build_dir`` (a local tree to
write the export into), ``read_manifest`` (the export already there, if any) and
``publish`` (make the tree visible atomically, then read back what was written).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Protocol

from kubetune import staging
from kubetune.errors import BadInputError


class Destination(Protocol):
    description: str

    def check(self) -> None: ...

    def build_dir(self) -> Path: ...

    def read_manifest(self) -> dict | None: ...

    def publish(self, tree: Path, manifest: dict, previous: dict | None) -> None: ...

    def discard(self, tree: Path) -> None: ...


def open_destination(uri: str, revision: str | None, work_dir: Path) -> Destination:
    """The destination ``uri`` names; ``work_dir`` holds the build tree of remote ones."""
    if uri.startswith("s3://"):
        from kubetune.exporter.destination_s3 import S3Destination

        return S3Destination(uri, work_dir)
    if uri.startswith("hf://"):
        from kubetune.exporter.destination_hf import HubDestination

        return HubDestination(uri, revision, work_dir)
    if uri.startswith("/") or uri.startswith("file://"):
        from kubetune.exporter.destination_local import LocalDestination

        return LocalDestination(uri)
    raise BadInputError(f"EXPORT_URI {uri!r} is not supported: use /abs/path, file:///abs/path, "
                        "s3://bucket/prefix or hf://org/repo")


def fresh_build_dir(work_dir: Path) -> Path:
    """An empty local tree (beside the workspace, on its volume) for a remote export."""
    tree = staging.staging_dir_for(work_dir / "export-upload")
    try:
        if tree.exists():
            shutil.rmtree(tree)
        tree.mkdir(parents=True)
    except OSError as exc:
        raise BadInputError(f"cannot build the export in {tree}: {exc.strerror}") from None
    return tree
