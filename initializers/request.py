"""What an initializer was asked to do, resolved from options and environment."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kubetune.initializers.storage_uri import StorageUri
from kubetune.redact import strip_userinfo


@dataclass(frozen=True)
class InitRequest:
    kind: str  # "model" or "dataset"
    uri: StorageUri
    output_path: Path
    allow_patterns: tuple[str, ...] = ()
    ignore_patterns: tuple[str, ...] = ()
    revision: str | None = None
    token: str | None = field(default=None, repr=False)

    def identity(self) -> dict:
        """What a completed tree must match for a rerun to skip the download."""
        return {
            "kind": self.kind,
            # Recorded in the manifest: never a URL's user or password (and the same
            # whatever the credentials of the run, so a rerun still matches).
            "storage_uri": strip_userinfo(self.uri.raw),
            "allow_patterns": list(self.allow_patterns),
            "ignore_patterns": list(self.ignore_patterns),
            "requested_revision": self.revision,
        }


def split_patterns(value: str | None) -> tuple[str, ...]:
    if not value:
        return ()
    return tuple(p.strip() for p in value.split(",") if p.strip())
