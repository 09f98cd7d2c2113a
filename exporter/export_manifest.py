"""The export manifest: what was exported, from what, and the sha256 of every file.

Written last (locally, to S3) or in the same commit (the hub): a reader trusts an export
only when ``manifest.json`` is there and the files match it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from kubetune.errors import BadInputError
from kubetune.atomic_write import write_atomic
from kubetune.file_hash import sha256_of
from kubetune.workspace import EXPORT_MANIFEST_NAME

VERSION = 1
# Fields that differ between two runs exporting the same thing, or record how it was checked.
_VOLATILE = ("exported_at", "verification")


def file_entries(tree: Path) -> list[dict]:
    entries = []
    for path in sorted(p for p in Path(tree).rglob("*") if p.is_file()):
        rel = path.relative_to(tree).as_posix()
        if rel != EXPORT_MANIFEST_NAME:
            entries.append({"path": rel, "size": path.stat().st_size, "sha256": sha256_of(path)})
    return entries


def build(tree: Path, *, fmt: str, base_model: dict, dataset: dict, training_config: str | None,
          metrics: dict, checkpoint: str | None, verification: dict,
          checkpoint_by: str | None = None, checkpoint_val_loss: float | None = None,
          identity: dict | None = None) -> dict:
    """``checkpoint``: the exported checkpoint's directory; ``checkpoint_by``: how it was
    chosen (last, best); ``checkpoint_val_loss``: its validation loss, where measured;
    ``identity``: what the run was (``run_identity.manifest_fields``: ``objective``,
    ``held_out``)."""
    return {
        "version": VERSION,
        "format": fmt,
        "files": file_entries(tree),
        "base_model": base_model,
        "dataset": dataset,
        **(identity or {}),
        "training_config": training_config,
        "metrics": metrics,
        "checkpoint": checkpoint,
        "checkpoint_by": checkpoint_by,
        "checkpoint_val_loss": checkpoint_val_loss,
        "verification": verification,
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def encode(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=2) + "\n").encode()


def write(tree: Path, manifest: dict) -> None:
    write_atomic(Path(tree) / EXPORT_MANIFEST_NAME, encode(manifest))


def same_export(found: dict | None, wanted: dict) -> bool:
    """True when ``found`` (a destination's manifest) describes exactly ``wanted``."""
    if not isinstance(found, dict):
        return False
    strip = lambda m: {k: v for k, v in m.items() if k not in _VOLATILE}  # noqa: E731
    return strip(found) == strip(wanted)


def check_tree(tree: Path, manifest: dict) -> None:
    """Every file the manifest lists is in ``tree`` with its size and sha256, and no other."""
    tree = Path(tree)
    listed = {e["path"] for e in manifest["files"]}
    extra = [e["path"] for e in file_entries(tree) if e["path"] not in listed]
    if extra:
        raise BadInputError(f"export holds {extra[0]}, which its manifest does not list")
    for entry in manifest["files"]:
        path = tree / entry["path"]
        if not path.is_file():
            raise BadInputError(f"export lacks {entry['path']}, which its manifest lists")
        if path.stat().st_size != entry["size"] or sha256_of(path) != entry["sha256"]:
            raise BadInputError(f"{entry['path']} as written does not match the sha256 in the "
                                "manifest: the export volume is corrupting data")


def file_sha256(path: Path) -> str:
    return sha256_of(path)
