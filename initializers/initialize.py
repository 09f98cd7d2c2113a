"""The initializer flow shared by the dataset and model steps."""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path

from kubetune import env, staging, storage_uri
from kubetune.initializers import reuse, source_change, verify_dataset, verify_model, weights
from kubetune.workspace import initializer_manifest
from kubetune.initializers.downloader import Downloader, check_space, disk_full
from kubetune.initializers.progress import Progress
from kubetune.initializers.request import InitRequest
from kubetune.initializers.settings import InitializerSettings
from kubetune.initializers.storage_uri import source_class
from kubetune.errors import BadInputError
from kubetune.file_hash import sha256_of
from kubetune.workspace import MANIFEST_NAME, REPO_ID_NAME

log = logging.getLogger("initializer")


def _repo_id(request: InitRequest) -> str:
    if request.uri.scheme == "hf":
        return storage_uri.hub(request.uri, env.STORAGE_URI).repo_id
    return request.uri.raw


def _check_output_writable(output: Path) -> None:
    parent = output.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not os.access(parent, os.W_OK):
        raise BadInputError(f"cannot write to {parent} (for OUTPUT_PATH {output}): mount a "
                            "writable volume there or set OUTPUT_PATH")


def _model_files(files, request: InitRequest):
    files, note = weights.choose(files)
    if note:
        log.info(note)
    if not weights.has_weights([f.path for f in files]):
        ignored = ",".join(request.ignore_patterns)
        hint = f" (IGNORE_PATTERNS={ignored} may exclude the only weights there are)" \
            if ignored else ""
        raise BadInputError(f"{request.uri.raw} has no model weights (.safetensors, .bin, .pt) "
                            f"to download{hint}")
    return files


def initialize(request: InitRequest) -> dict:
    """Fill ``request.output_path``; return the completion manifest."""
    output = staging.follow_link(request.output_path, "OUTPUT_PATH")
    identity = request.identity()
    if _up_to_date(request, output, identity, say=False):
        log.info("%s already holds %s: nothing to download", output, request.uri.raw)
        return initializer_manifest.read_manifest(output)
    # Filling replaces what the output holds: refuse before anything is fetched when that
    # would take a user's files (or a file at OUTPUT_PATH) with it.
    staging.refuse_foreign(output, "OUTPUT_PATH")
    _check_output_writable(output)
    with staging.lock(output):
        if _up_to_date(request, output, identity):  # the run we waited for did it
            log.info("%s already holds %s: nothing to download", output, request.uri.raw)
            return initializer_manifest.read_manifest(output)
        staging.refuse_foreign(output, "OUTPUT_PATH")
        try:
            return _fill(request, output, identity)
        except BadInputError:
            # Fixing the input means a new request: nothing staged is worth keeping. A
            # transient failure keeps it: the restart resumes the download from it.
            staging.discard(output)
            raise


def _listing(source, request: InitRequest) -> list:
    """What a fetch of ``request`` would fetch from ``source``: its files, narrowed."""
    files = source.list_files()
    if not files:
        raise BadInputError(f"{request.uri.raw} holds no files to download "
                            "(check the path and ALLOW_PATTERNS / IGNORE_PATTERNS)")
    return _model_files(files, request) if request.kind == "model" else files


def _up_to_date(request: InitRequest, output: Path, identity: dict, say: bool = True) -> bool:
    """Whether ``output`` already holds what ``request`` names: its manifest matches the
    request and, for a source on a mounted volume, that source still holds the files
    staged (an edit in place under the same URI is staged again; ``say``: in a line)."""
    if not initializer_manifest.satisfies(output, identity):
        return False
    scheme = source_class(request.uri.scheme)
    if not hasattr(scheme, "local_path"):
        return True  # a hub revision or an S3 listing: the request names what it holds
    source = scheme(request)
    return source_change.still_staged(output, _listing(source, request), source.local_path,
                                      request.kind, request.uri.raw, say)


def _fill(request: InitRequest, output: Path, identity: dict) -> dict:
    # The numbers the download runs with, checked before the first request.
    settings = InitializerSettings()
    settings.download_workers, settings.progress_interval_s  # noqa: B018 (parsed, cached)
    source = source_class(request.uri.scheme)(request)
    files = _listing(source, request)
    revision = source.resolved_revision()
    if request.revision and revision is None:
        log.warning("REVISION=%s is ignored: %s sources have no revisions", request.revision,
                    request.uri.scheme)
    total = sum(f.size or 0 for f in files)
    log.info("%s: %d files, %.1f MB%s", request.uri.raw, len(files), total / 1e6,
             f" at revision {revision}" if revision else "")

    staged = staging.prepare(output)
    staging.prune(staged, {f.path for f in files})
    reuse.seed_from_output(output, staged, files)
    check_space(staged, files)
    with Progress(len(files), total, settings.progress_interval_s) as progress:
        recorded = Downloader(source, staged, progress, settings).fetch_all(files)
        log.info(progress.summary())

    try:
        mtimes = {f.path: f.mtime_ns for f in files if f.mtime_ns is not None}
        result = _describe_and_commit(request, staged, output, identity, revision, recorded,
                                      mtimes)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # No manifest in staging (the atomic write leaves none half-written): a re-run
        # re-verifies the files.
        (staged / MANIFEST_NAME).unlink(missing_ok=True)
        raise disk_full(staged) from None
    log.info("%s is ready at %s", request.kind, output)
    return result


def _describe_and_commit(request: InitRequest, staged: Path, output: Path, identity: dict,
                         revision: str | None, recorded: list,
                         source_mtimes: dict[str, int]) -> dict:
    if request.kind == "model":
        for note in verify_model.verify(staged):
            log.info(note)
        repo_file = staged / REPO_ID_NAME
        if not repo_file.exists():
            # torchtune's HF checkpointer reads it to fill adapter_config.json's
            # base_model_name_or_path; upstream's initializer never writes it.
            repo_file.write_text(json.dumps({"repo_id": _repo_id(request)}))
            recorded.append((REPO_ID_NAME, repo_file.stat().st_size,
                             sha256_of(repo_file)))
    else:
        descriptor = verify_dataset.describe(staged)
        verify_dataset.write_descriptor(staged, descriptor)
        log.info("dataset: %d rows of %s in %d file(s), columns %s", descriptor["rows"],
                 descriptor["format"], len(descriptor["files"]), descriptor["columns"])

    result = initializer_manifest.build(identity, revision, recorded, source_mtimes)
    initializer_manifest.write(staged, result)
    staging.commit(staged, output)
    return result
