"""The base model the run started from: its weights on the PVC and how a user names it."""

from __future__ import annotations

import json
from pathlib import Path

from kubetune import storage_uri
from kubetune.initializers import manifest as init_manifest
from kubetune.workspace import REPO_ID_NAME


def reference(model_dir: Path) -> tuple[str, str | None]:
    """(base_model_name_or_path, revision) as a serving stack should be told them.

    A hub source is named by its repo id (what ``from_pretrained`` resolves) at the
    revision the initializer resolved; a PVC or local source by its path, since a
    ``file://`` URI is not something PEFT or transformers can load.
    """
    model_dir = Path(model_dir)
    found = init_manifest.read(model_dir) or {}
    uri = found.get("storage_uri") or ""
    revision = found.get("resolved_revision") or found.get("requested_revision")
    where = storage_uri.recorded(uri)
    if isinstance(where, storage_uri.HubUri):
        return where.repo_id, revision
    if isinstance(where, storage_uri.FileUri):
        return str(where.path), revision
    try:
        repo_id = json.loads((model_dir / REPO_ID_NAME).read_text()).get("repo_id")
    except (OSError, ValueError, AttributeError):
        repo_id = None
    named = storage_uri.recorded(repo_id) if repo_id and "://" in repo_id else None
    if isinstance(named, storage_uri.FileUri):
        repo_id = str(named.path)
    # An s3:// source has no name a loader understands: the weights on the PVC do.
    return repo_id if repo_id and "://" not in repo_id else str(model_dir.resolve()), revision


def source(model_dir: Path) -> dict:
    """What the model initializer fetched, for the export manifest."""
    found = init_manifest.read(Path(model_dir)) or {}
    name, revision = reference(model_dir)
    return {"name": name, "source": found.get("storage_uri"), "revision": revision}


def dataset_source(dataset_dir: Path) -> dict:
    found = init_manifest.read(Path(dataset_dir)) or {}
    return {"source": found.get("storage_uri"),
            "revision": found.get("resolved_revision") or found.get("requested_revision")}


def weight_files(model_dir: Path) -> list[Path]:
    from kubetune.trainer.checkpoint_model import weight_files as names

    return [Path(model_dir) / name for name in names(Path(model_dir))]
