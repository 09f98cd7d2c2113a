"""The completion manifest: written last, it says the tree is whole and what it holds."""

from __future__ import annotations

import json
import time
from pathlib import Path

from kubetune.atomic_write import write_atomic

from kubetune.workspace import MANIFEST_NAME
# The one reader of the manifest, shared with the steps that come after.
from kubetune.workspace.initializer_manifest import read_manifest as read


def build(identity: dict, resolved_revision: str | None, tree: Path,
          files: list[tuple[str, int, str]]) -> dict:
    return {
        "version": 1,
        **identity,
        "resolved_revision": resolved_revision,
        "files": [{"path": p, "size": s, "sha256": h} for p, s, h in sorted(files)],
        "completed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write(tree: Path, manifest: dict) -> None:
    write_atomic(Path(tree) / MANIFEST_NAME, json.dumps(manifest, indent=2))


def satisfies(tree: Path, identity: dict) -> bool:
    """True when ``tree`` is a complete earlier result of the same request."""
    found = read(tree)
    if not found or any(found.get(k) != v for k, v in identity.items()):
        return False
    for entry in found.get("files", []):
        path = tree / entry["path"]
        if not path.is_file() or path.stat().st_size != entry["size"]:
            return False
    return True
