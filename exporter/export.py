"""The export flow: locate, build, verify, commit with a manifest written last."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from exporter import artifact, verify
from exporter.destination_local import LocalDestination
from exporter.training_output import locate
from initializers.manifest import sha256_of
from kubetune.errors import BadInputError
from kubetune.workspace import EXPORT_MANIFEST_NAME

log = logging.getLogger("exporter")


@dataclass(frozen=True)
class ExportRequest:
    output_dir: Path
    model_dir: Path
    dataset_dir: Path
    destination: str
    format: str | None = None


def _manifest(request: ExportRequest, fmt: str, tree: Path, training) -> dict:
    from initializers import manifest as init_manifest

    files = []
    for path in sorted(p for p in tree.rglob("*") if p.is_file()):
        rel = path.relative_to(tree).as_posix()
        if rel != EXPORT_MANIFEST_NAME:
            files.append({"path": rel, "size": path.stat().st_size, "sha256": sha256_of(path)})
    model = init_manifest.read(request.model_dir) or {}
    dataset = init_manifest.read(request.dataset_dir) or {}
    base_name, base_revision = artifact.base_model_reference(request.model_dir)
    config_path = training.output_dir / training.marker.get("config", "")
    return {
        "version": 1,
        "format": fmt,
        "files": files,
        "base_model": {"name": base_name, "source": model.get("storage_uri"),
                       "revision": base_revision},
        "dataset": {"source": dataset.get("storage_uri"),
                    "revision": dataset.get("resolved_revision")},
        "training_config": config_path.read_text() if config_path.is_file() else None,
        "metrics": training.summary(),
        "checkpoint": training.marker.get("checkpoint"),
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def export(request: ExportRequest) -> dict:
    training = locate(request.output_dir)
    fmt = request.format or artifact.default_format(training)
    if fmt not in artifact.FORMATS:
        raise BadInputError(f"EXPORT_FORMAT {fmt!r} is not one of {', '.join(artifact.FORMATS)}")
    destination = LocalDestination(request.destination)
    staged = destination.stage()
    adapter_dir = staged if fmt == "adapter" else staged / "adapter"
    merged_dir = staged if fmt == "merged" else staged / "merged"
    if fmt in ("adapter", "both"):
        artifact.write_adapter(training, request.model_dir, adapter_dir)
        pairs = verify.check_adapter(adapter_dir / "adapter_model.safetensors", request.model_dir)
        log.info("adapter: %d LoRA pairs fit the base model's weights", pairs)
    if fmt in ("merged", "both"):
        artifact.write_merged(training, merged_dir)
    result = _manifest(request, fmt, staged, training)
    (staged / EXPORT_MANIFEST_NAME).write_text(json.dumps(result, indent=2))
    destination.commit(staged)
    log.info("exported %s to %s", fmt, destination.path)
    return result
