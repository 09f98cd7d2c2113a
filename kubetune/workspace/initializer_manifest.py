"""The initializers' completion manifest (``.kubetune-manifest.json``), as a later step
reads it: what was fetched, from where, at which revision.

The initializer writes it last (``kubetune.initializers.manifest``), so a tree without it
is incomplete. The exporter reads it once per tree and passes the result around.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from kubetune.workspace import MANIFEST_NAME


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
