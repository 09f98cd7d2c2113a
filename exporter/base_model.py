"""The base model the run started from: its weights on the PVC and how a user names it."""

from __future__ import annotations

from pathlib import Path

from kubetune import storage_uri
from kubetune.workspace.initializer_manifest import InitializerManifest
from kubetune.workspace.model_files import original_repo_id
from kubetune.workspace.model_files import weight_files as weight_names


def reference(model_dir: Path, found: InitializerManifest) -> tuple[str, str | None]:
    """(base_model_name_or_path, revision) as a serving stack should be told them.

    A hub source is named by its repo id (what ``from_pretrained`` resolves) at the
    revision the initializer resolved; a PVC or local source by its path, since a
    ``file://`` URI is not something PEFT or transformers can load. ``found`` is the
    model initializer's manifest of ``model_dir``.
    """
    model_dir = Path(model_dir)
    uri = found.storage_uri or ""
    revision = found.revision
    where = storage_uri.recorded(uri)
    if isinstance(where, storage_uri.HubUri):
        return where.repo_id, revision
    if isinstance(where, storage_uri.FileUri):
        return str(where.path), revision
    repo_id = original_repo_id(model_dir)
    named = storage_uri.recorded(repo_id) if repo_id and "://" in repo_id else None
    if isinstance(named, storage_uri.FileUri):
        repo_id = str(named.path)
    # An s3:// source has no name a loader understands: the weights on the PVC do.
    return repo_id if repo_id and "://" not in repo_id else str(model_dir.resolve()), revision


def source(model_dir: Path, found: InitializerManifest) -> dict:
    """What the model initializer fetched, for the export manifest (``found``: its manifest)."""
    name, revision = reference(model_dir, found)
    return {"name": name, "source": found.storage_uri, "revision": revision}


def dataset_source(found: InitializerManifest) -> dict:
    """What the dataset initializer fetched (``found``: its manifest), for the export manifest."""
    return {"source": found.storage_uri, "revision": found.revision}


def weight_files(model_dir: Path) -> list[Path]:
    return [Path(model_dir) / name for name in weight_names(Path(model_dir))]
