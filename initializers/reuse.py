"""A changed request over an earlier complete result moves only the difference.

Changing ALLOW_PATTERNS / IGNORE_PATTERNS (or the revision) makes the earlier manifest not
match the request, so the tree is built again in staging. The files the earlier result
already holds are linked into the staging tree first (same volume: no copy); the
downloader then keeps each one only if the source's checksum proves it is the listed
version, exactly as it treats a file a killed run left, and fetches the rest.

Only a file that is ours alone is linked (one link: the output's): both names are then
ours, and the swap removes the old one. A file with other links (an output an older
version hard-linked from a ``file://`` source) is copied, so the new output shares no inode
with a user's file.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from kubetune.workspace import initializer_manifest
from kubetune.initializers.copy_file import copy_file
from kubetune.initializers.safe_paths import safe_join
from kubetune.initializers.sources.base import RemoteFile
from kubetune.errors import BadInputError

log = logging.getLogger("initializer")


def seed_from_output(output: Path, staged: Path, files: list[RemoteFile]) -> int:
    """Link the listed files that ``output``'s complete earlier result holds into ``staged``;
    return how many were linked."""
    previous = initializer_manifest.read_manifest(output)
    if not isinstance(previous, dict):
        return 0  # no complete result there: nothing is trusted enough to start from
    sizes = {e.get("path"): e.get("size") for e in previous.get("files", [])
             if isinstance(e, dict)}
    linked = 0
    for remote in files:
        if remote.path not in sizes or remote.size not in (None, sizes[remote.path]):
            continue
        try:
            have, target = safe_join(output, remote.path), safe_join(staged, remote.path)
        except BadInputError:
            continue
        if (target.exists() or target.is_symlink() or have.is_symlink() or not have.is_file()
                or have.stat().st_size != sizes[remote.path]):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            if have.stat().st_nlink == 1:
                os.link(have, target)
            else:
                copy_file(have, target)
        except OSError:
            target.unlink(missing_ok=True)
            continue  # another volume (OUTPUT_PATH is a mount point): fetched as usual
        linked += 1
    if linked:
        log.info("%d of %d files are already in %s from an earlier request: each is kept if "
                 "its checksum matches the source", linked, len(files), output)
    return linked
