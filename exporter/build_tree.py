"""The local tree an export is built in: ``empty_tree`` for every destination, and for a
remote one (S3, the hub) ``build_tree``, where it is built before it is uploaded.

A remote export: one tree per destination, under a lock held for the whole export. Exports of one run to
two destinations at once (a user's two `kubetune export`s over one workspace) build in
two trees: one shared tree had each rebuild it under the other, and the slower one read
files the faster had already removed. A second export to the same destination (a
restarted pod beside the one still terminating) waits for the first, then finds its
manifest at the destination and uploads nothing. The tree is named by a hash of the
destination: its name carries no bucket or repository (nor anything a URI may hold).
A killed export leaves its tree; the next export removes every tree whose lock nobody
holds (another destination's too), so the volume does not keep them.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import shutil
from pathlib import Path
from typing import Iterator

from kubetune import file_lock, staging
from kubetune.errors import BadInputError

log = logging.getLogger("exporter")


@contextlib.contextmanager
def empty_tree(tree: Path, cannot: str) -> Iterator[Path]:
    """``tree`` made empty (what a killed export left goes) for the block, removed after it
    unless published (moved away) by then; ``cannot``: the error's words when it cannot
    be made."""
    try:
        if tree.exists():
            shutil.rmtree(tree)
        tree.mkdir(parents=True)
    except OSError as exc:
        raise BadInputError(f"{cannot}: {exc.strerror}") from None
    try:
        yield tree
    finally:
        shutil.rmtree(tree, ignore_errors=True)


_NAME = "export-upload"


def tree_path(work_dir: Path, destination: str) -> Path:
    """Where the export to ``destination`` is built, on the workspace's volume."""
    key = hashlib.sha256(destination.encode("utf-8")).hexdigest()[:16]
    return staging.staging_dir_for(work_dir / f"{_NAME}-{key}")


def _lock_of(tree: Path) -> Path:
    return tree.with_name(f"{tree.name}.lock")


def _remove_abandoned(work_dir: Path) -> None:
    """Remove the trees exports that died left (an export still running holds its lock)."""
    prefix = staging.staging_dir_for(work_dir / _NAME)
    for tree in prefix.parent.glob(f"{prefix.name}*"):
        if not tree.is_dir():
            continue
        try:
            with file_lock.hold(_lock_of(tree), wait=False):
                shutil.rmtree(tree, ignore_errors=True)
        except (file_lock.LockHeld, OSError):
            continue


@contextlib.contextmanager
def build_tree(work_dir: Path, destination: str) -> Iterator[Path]:
    """An empty tree for one export to ``destination``, held for the block and removed
    after it (a killed export leaves it: the next export removes it, or starts it over)."""
    _remove_abandoned(work_dir)
    tree = tree_path(work_dir, destination)
    with file_lock.hold(_lock_of(tree), on_wait=lambda holder: log.info(
            "another export to %s is running (%s): waiting for it", destination, holder)), \
            empty_tree(tree, f"cannot build the export in {tree}"):
        yield tree
