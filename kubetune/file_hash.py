"""The sha256 of a file, as every manifest we write records it."""

from __future__ import annotations

import hashlib
from pathlib import Path

HASH_CHUNK = 8 * 1024 * 1024


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(HASH_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()
