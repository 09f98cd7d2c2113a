"""The initializer flow shared by the dataset and model steps."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from initializers import manifest, staging, verify_dataset, verify_model
from initializers.request import InitRequest
from initializers.safe_paths import safe_join
from initializers.storage_uri import source_class
from kubetune.errors import BadInputError
from kubetune.workspace import REPO_ID_NAME

log = logging.getLogger("initializer")


def _repo_id(request: InitRequest) -> str:
    uri = request.uri
    if uri.scheme == "hf":
        return "/".join(uri.location.split("/")[:2])
    return uri.raw


def initialize(request: InitRequest) -> dict:
    """Fill ``request.output_path``; return the completion manifest."""
    output = request.output_path
    identity = request.identity()
    if manifest.satisfies(output, identity):
        log.info("%s already holds %s: nothing to download", output, request.uri.raw)
        return manifest.read(output)

    source = source_class(request.uri.scheme)(request)
    files = source.list_files()
    if not files:
        raise BadInputError(f"{request.uri.raw} holds no files to download "
                            "(check the path and ALLOW_PATTERNS / IGNORE_PATTERNS)")
    revision = source.resolved_revision()
    total = sum(f.size or 0 for f in files)
    log.info("%s: %d files, %.1f MB%s", request.uri.raw, len(files), total / 1e6,
             f" at revision {revision}" if revision else "")

    staged = staging.prepare(output)
    staging.prune(staged, {f.path for f in files})
    start = time.monotonic()
    recorded = []
    for remote in files:
        target = safe_join(staged, remote.path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if not (target.is_file() and remote.size is not None
                and target.stat().st_size == remote.size):
            part = target.with_name(target.name + staging.PART_SUFFIX)
            source.fetch(remote, part)
            part.replace(target)
        size = target.stat().st_size
        if remote.size is not None and size != remote.size:
            raise BadInputError(f"{remote.path}: got {size} bytes, the source lists {remote.size}")
        digest = manifest.sha256_of(target)
        if remote.sha256 and digest != remote.sha256:
            target.unlink()
            raise BadInputError(f"{remote.path}: sha256 mismatch against the source's checksum")
        recorded.append((remote.path, size, digest))
    elapsed = time.monotonic() - start
    log.info("fetched %d files in %.1fs", len(files), elapsed)

    if request.kind == "model":
        for note in verify_model.verify(staged):
            log.info(note)
        repo_file = staged / REPO_ID_NAME
        if not repo_file.exists():
            # torchtune's HF checkpointer reads it to fill adapter_config.json's
            # base_model_name_or_path; upstream's initializer never writes it.
            repo_file.write_text(json.dumps({"repo_id": _repo_id(request)}))
            recorded.append((REPO_ID_NAME, repo_file.stat().st_size,
                             manifest.sha256_of(repo_file)))
    else:
        descriptor = verify_dataset.describe(staged)
        verify_dataset.write_descriptor(staged, descriptor)
        log.info("dataset: %d rows of %s in %d file(s), columns %s", descriptor["rows"],
                 descriptor["format"], len(descriptor["files"]), descriptor["columns"])

    result = manifest.build(identity, revision, staged, recorded)
    manifest.write(staged, result)
    staging.commit(staged, output)
    log.info("%s is ready at %s", request.kind, output)
    return result
