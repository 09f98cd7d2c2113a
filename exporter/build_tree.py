"""The local tree a remote export (S3, the hub) is built in before it is uploaded."""

from __future__ import annotations

import shutil
from pathlib import Path

from kubetune import staging
from kubetune.errors import BadInputError


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
