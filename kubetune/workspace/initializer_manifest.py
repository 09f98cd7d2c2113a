"""The initializers' completion manifest (``.kubetune-manifest.json``): what was fetched,
from where, at which revision, with every file's size and sha256.

The initializer builds it and writes it last (`build`, `write`), so a tree without it is
incomplete; a rerun of the same request is satisfied by it (`satisfies`); a later step
reads it (`read_manifest`, `InitializerManifest`: the exporter reads it once per tree and
passes the result around). One module for the one file, writer and readers together.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from kubetune.atomic_write import write_atomic
from kubetune.workspace import MANIFEST_NAME

# A file entry's modification time of the source file it was copied from (ns), where the
# source is a mounted volume.
SOURCE_MTIME = "source_mtime_ns"


def build(identity: dict, resolved_revision: str | None, files: list[tuple[str, int, str]],
          source_mtimes: dict[str, int] | None = None) -> dict:
    """The manifest of a tree holding ``files`` (path, size, sha256), fetched for the
    request ``identity`` names; ``source_mtimes``: a mounted source's modification time
    (ns) of each file as listed, recorded as ``source_mtime_ns`` (a rerun stats the source
    against it, `kubetune.initializers.source_change`)."""
    mtimes = source_mtimes or {}

    def entry(path: str, size: int, sha256: str) -> dict:
        found = {"path": path, "size": size, "sha256": sha256}
        return found | ({SOURCE_MTIME: mtimes[path]} if path in mtimes else {})

    return {
        "version": 1,
        **identity,
        "resolved_revision": resolved_revision,
        "files": [entry(p, s, h) for p, s, h in sorted(files)],
        "completed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write(tree: Path, manifest: dict) -> None:
    write_atomic(Path(tree) / MANIFEST_NAME, json.dumps(manifest, indent=2))


def satisfies(tree: Path, identity: dict) -> bool:
    """True when ``tree`` is a complete earlier result of the same request."""
    found = read_manifest(tree)
    if not found or any(found.get(k) != v for k, v in identity.items()):
        return False
    for entry in found.get("files", []):
        path = tree / entry["path"]
        if not path.is_file() or path.stat().st_size != entry["size"]:
            return False
    return True


def read_manifest(tree: Path) -> dict | None:
    """The manifest as written, or None when ``tree`` has none (or an unreadable one)."""
    try:
        return json.loads((Path(tree) / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class InitializerManifest:
    """What an initializer says it fetched; every field empty when it left no manifest."""

    storage_uri: str | None = None
    resolved_revision: str | None = None
    requested_revision: str | None = None
    files: list[dict] = field(default_factory=list)

    @property
    def revision(self) -> str | None:
        """The revision a reader should name: the one resolved, else the one asked for."""
        return self.resolved_revision or self.requested_revision

    def content_digest(self) -> str | None:
        """What the tree holds, by its files' paths and sha256 (None: no manifest): the
        same URI fetched again with other files in it gives another digest."""
        if not self.files:
            return None
        listed = sorted(f"{f.get('path')}\0{f.get('sha256')}" for f in self.files)
        return hashlib.sha256("\n".join(listed).encode()).hexdigest()[:16]

    @classmethod
    def read(cls, tree: Path) -> "InitializerManifest":
        found = read_manifest(tree)
        if not isinstance(found, dict):
            return cls()
        return cls(storage_uri=found.get("storage_uri"),
                   resolved_revision=found.get("resolved_revision"),
                   requested_revision=found.get("requested_revision"),
                   files=list(found.get("files") or []))
