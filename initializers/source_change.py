"""Whether a source on a mounted volume (``file://``) still holds what was staged from it.

The same request over a complete earlier result is otherwise satisfied by the manifest
alone, so a dataset edited in place under the same URI would never be staged again (and
the trainer, which names its inputs by the staged content, would find its run complete).

Cheap where nothing changed: every source file is stat'ed, and only one whose size or
modification time differs from the manifest's record is read and hashed. A file whose
sha256 is still the recorded one (touched, copied back, or recorded before modification
times were) is no change: its new time is written into the manifest, so the next rerun
does not hash it again. A file added to the source, or gone from it, is a change.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from kubetune.file_hash import sha256_of
from kubetune.initializers.sources.base import RemoteFile
from kubetune.workspace import REPO_ID_NAME, initializer_manifest
from kubetune.workspace.initializer_manifest import SOURCE_MTIME

log = logging.getLogger("initializer")

MOST_NAMED = 3  # changed files named in the log line; the rest counted


def _changed(listed: list[RemoteFile], entries: dict[str, dict],
             path_of: Callable[[RemoteFile], Path]) -> tuple[list[str], bool]:
    """The listed files whose content differs from their entry (or that have none), and
    whether an entry's recorded time was brought up to date."""
    changed, refreshed = [], False
    for remote in listed:
        entry = entries.get(remote.path)
        if entry is None or entry.get("size") != remote.size:
            changed.append(remote.path)
            continue
        if remote.mtime_ns is not None and entry.get(SOURCE_MTIME) == remote.mtime_ns:
            continue  # same size, same time: not read
        if sha256_of(path_of(remote)) != entry.get("sha256"):
            changed.append(remote.path)
        elif remote.mtime_ns is not None:
            entry[SOURCE_MTIME] = remote.mtime_ns
            refreshed = True
    return changed, refreshed


def still_staged(output: Path, listed: list[RemoteFile], path_of: Callable[[RemoteFile], Path],
                 kind: str, uri: str, say: bool = True) -> bool:
    """True when ``output``'s manifest records every file of ``listed`` (the source's
    listing now, narrowed as a fetch would) with the same content, and no other; else
    False, and (``say``) a line naming what changed."""
    manifest = initializer_manifest.read_manifest(output) or {}
    entries = {e.get("path"): e for e in manifest.get("files", []) if isinstance(e, dict)}
    names = {remote.path for remote in listed}
    if kind == "model" and REPO_ID_NAME not in names:
        entries_expected = set(entries) - {REPO_ID_NAME}  # written by the initializer
    else:
        entries_expected = set(entries)
    changed, refreshed = _changed(listed, entries, path_of)
    changed += sorted(entries_expected - names)  # gone from the source
    if changed:
        if not say:
            return False
        more = f" and {len(changed) - MOST_NAMED} more" if len(changed) > MOST_NAMED else ""
        log.info("%s changed since it was staged in %s (%s%s): staging it again", uri, output,
                 ", ".join(changed[:MOST_NAMED]), more)
        return False
    if refreshed:
        try:
            initializer_manifest.write(output, manifest)
        except OSError:
            pass  # a read-only output: the next rerun hashes those files again, no harm
    return True
