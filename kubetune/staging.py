"""Download into a sibling directory on the same volume, then swap it into place.

A reader of ``OUTPUT_PATH`` sees either nothing or a complete, verified tree: files are
fetched into ``.kubetune-staging-<name>`` next to it (``*.part`` until whole), the
manifest is written last, and the staged tree replaces the output by rename. A killed
pod leaves only the staging directory, which the next run resumes from: whole files are
re-verified, ``*.part`` files are resumed by sources that can (or overwritten).

An output that is a symlink is filled where it points (``follow_link``): the link stays; a
symlink to nothing is refused, as its data would land beside it.

An output that is a mount point (a volume, or a Kubernetes ``subPath``: a bind mount of
a directory of the same filesystem, which ``os.path.ismount`` misses) cannot be renamed
over, and a rename into it from outside fails (EXDEV). It is staged inside itself instead,
and its contents are swapped: the old manifest goes first (nothing half-replaced is ever
trusted), then the old entries, then the staged ones, the manifest last. Before its first
move the swap writes a journal (``.kubetune-staging-<name>.owned.json`` inside the output)
naming every path it may leave there, so a run killed mid-swap finds them still ours.

What a step may remove: only what it wrote itself, as its manifest (or a swap journal)
lists it, and its own ``.kubetune*`` bookkeeping. Anything else in the output is a user's:
``foreign_entries`` finds it and the step refuses (exit 65) before touching the output.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Iterator

from kubetune import file_lock
from kubetune.atomic_write import write_atomic
from kubetune.errors import BadInputError
from kubetune.workspace import MANIFEST_NAME, STAGING_PREFIX

PART_SUFFIX = ".part"
# Beside a ``*.part``, what a source keeps to resume it after a kill (which ranges are
# whole); it goes with its part: kept, pruned and removed together.
PART_STATE_SUFFIX = ".part-state"
log = logging.getLogger("initializer")


def lock_path(output_path: Path) -> Path:
    return output_path.parent / f"{STAGING_PREFIX}{output_path.name}.lock"


@contextlib.contextmanager
def lock(output_path: Path) -> Iterator[None]:
    """Hold the one lock on ``output_path``'s staging area for as long as the block runs
    (``kubetune.file_lock``: it dies with its process, so a killed pod never leaves it held).

    A restarted pod can start while the old one is still terminating; both writing one
    staging tree would interleave files. The second waits, then usually finds the first's
    completed manifest.
    """
    with file_lock.hold(lock_path(output_path), on_wait=lambda holder: log.info(
            "another initializer is filling %s (%s): waiting for it", output_path, holder)):
        yield


# A volume's own entries, never ours to remove.
VOLUME_ENTRIES = ("lost+found",)
# Our bookkeeping (manifests, descriptors, staging, journals) starts so; no data file does.
_BOOKKEEPING_PREFIX = ".kubetune"


def _journal(output_path: Path) -> Path:
    return output_path / f"{STAGING_PREFIX}{output_path.name}.owned.json"


def _listed(record: Path) -> set[str]:
    """The paths a manifest (or a swap journal) lists; none when it is missing or unreadable."""
    try:
        found = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    entries = found.get("files") if isinstance(found, dict) else None
    return {e["path"] for e in entries if isinstance(e, dict) and isinstance(e.get("path"), str)
            } if isinstance(entries, list) else set()


def owned_paths(output_path: Path, manifest_name: str = MANIFEST_NAME) -> set[str]:
    """The paths in ``output_path`` that a step wrote: its manifest's and a swap journal's."""
    return _listed(output_path / manifest_name) | _listed(_journal(output_path)) | {manifest_name}


def foreign_entries(output_path: Path, manifest_name: str = MANIFEST_NAME) -> list[str]:
    """What ``output_path`` holds that no step wrote (a user's files), as relative paths; a
    directory holding nothing of ours is named once, with a trailing slash."""
    if not output_path.is_dir():
        return []
    owned = owned_paths(output_path, manifest_name)
    found: list[str] = []

    def walk(directory: Path, prefix: str) -> None:
        for child in sorted(directory.iterdir()):
            rel = prefix + child.name
            if not prefix and (child.name.startswith(_BOOKKEEPING_PREFIX)
                               or child.name in VOLUME_ENTRIES):
                continue
            if child.is_dir() and not child.is_symlink():
                if any(path.startswith(rel + "/") for path in owned):
                    walk(child, rel + "/")
                else:
                    found.append(rel + "/")
            elif rel not in owned:
                found.append(rel)

    walk(output_path, "")
    return found


def name_a_few(paths: list[str], few: int = 3) -> str:
    shown = ", ".join(paths[:few])
    return shown + (f" and {len(paths) - few} more" if len(paths) > few else "")


def refuse_dangling_link(output_path: Path, what: str) -> None:
    """Refuse (exit 65) an output that is a symlink to nothing: its target is missing (a
    volume not mounted, a typo), and the swap-in would replace the link by a directory,
    so the data would land beside where the user meant it to go."""
    if output_path.is_symlink() and not output_path.exists():
        raise BadInputError(f"{what} {output_path} is a symlink to {os.readlink(output_path)}, "
                            "which does not exist: create (or mount) its target, or remove "
                            "the link")


def follow_link(output_path: Path, what: str) -> Path:
    """The directory a step fills for ``output_path``: the path itself, or, when it is a
    symlink, the directory it points to (a link to another volume is the user's way to put
    the data there; replacing the link by a directory would put it beside the link). A
    symlink to nothing is refused (exit 65)."""
    refuse_dangling_link(output_path, what)
    return Path(os.path.realpath(output_path)) if output_path.is_symlink() else output_path


def refuse_foreign(output_path: Path, what: str, manifest_name: str = MANIFEST_NAME) -> None:
    """Refuse (exit 65) an output that is a file or a dangling symlink, or holds files no
    step of ours wrote: filling it would replace them, and a user's files are never ours
    to remove."""
    refuse_dangling_link(output_path, what)
    if output_path.exists() and not output_path.is_dir():
        raise BadInputError(f"{what} {output_path} is a file, not a directory: move it away or "
                            "name a directory")
    foreign = foreign_entries(output_path, manifest_name)
    if foreign:
        raise BadInputError(f"{what} {output_path} holds files kubetune did not write "
                            f"({name_a_few(foreign)}): move them away or name an empty "
                            "directory (kubetune replaces only what it wrote there)")


def discard(output_path: Path) -> None:
    """Remove the staging a run that failed cleanly leaves, unless a swap into the output
    was under way (its journal is there: the next run finishes it)."""
    staged = staging_dir_for(output_path)
    if staged.is_dir() and not _journal(output_path).exists():
        shutil.rmtree(staged, ignore_errors=True)


def _mount_points() -> set[str]:
    # Field 5 of /proc/self/mountinfo, with spaces and such escaped in octal.
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as table:
            return {re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)),
                           line.split()[4])
                    for line in table if len(line.split()) > 4}
    except OSError:
        return set()


def is_mount_point(path: Path) -> bool:
    """Whether something is mounted on ``path``, a same-filesystem bind mount included."""
    if os.path.ismount(path):
        return True
    return path.is_dir() and os.path.realpath(path) in _mount_points()


def staging_dir_for(output_path: Path) -> Path:
    if is_mount_point(output_path):
        return output_path / f"{STAGING_PREFIX}{output_path.name}"
    return output_path.parent / f"{STAGING_PREFIX}{output_path.name}"


def part_state_path(part: Path) -> Path:
    return part.with_name(part.name.removesuffix(PART_SUFFIX) + PART_STATE_SUFFIX)


def prepare(output_path: Path) -> Path:
    staging = staging_dir_for(output_path)
    staging.mkdir(parents=True, exist_ok=True)
    # A manifest in staging means a run died between writing it and the swap: the files
    # are re-verified anyway, and the manifest is written again last.
    (staging / MANIFEST_NAME).unlink(missing_ok=True)
    return staging


def prune(staging: Path, keep: set[str]) -> None:
    """Remove files a previous, different request left in the staging tree."""
    for path in sorted(staging.rglob("*"), reverse=True):
        rel = path.relative_to(staging).as_posix()
        if path.is_file() or path.is_symlink():
            name = rel.removesuffix(PART_SUFFIX).removesuffix(PART_STATE_SUFFIX)
            if path.is_symlink() or name not in keep:
                path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def commit(staging: Path, output_path: Path, manifest_name: str = MANIFEST_NAME) -> None:
    """Make the staged tree the output, atomically where the volume allows. The caller has
    made sure (``refuse_foreign``) that the output holds nothing but what a step wrote."""
    if staging.parent == output_path or is_mount_point(output_path):
        swap_contents(staging, output_path, manifest_name)
        return
    if output_path.exists():
        retired = output_path.parent / f"{STAGING_PREFIX}retired-{output_path.name}"
        if retired.exists():
            shutil.rmtree(retired)
        try:
            os.replace(output_path, retired)
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            # A mount point /proc did not show us.
            swap_contents(staging, output_path, manifest_name)
            return
        os.replace(staging, output_path)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        output_path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging, output_path)


def swap_contents(staging: Path, output_path: Path, manifest_name: str = MANIFEST_NAME) -> None:
    """Replace what ``output_path`` holds with what ``staging`` holds, manifest last.

    Not atomic, but never trusted half-done: the old manifest is removed first, so a
    kill part-way leaves an output no step reads, and the next run stages again (files
    already moved are fetched again). The journal written before the first move names
    everything the swap may leave, so the next run knows those files are its own. Only
    what a step wrote is removed: anything else stays where it is."""
    journal = _journal(output_path)
    ours = owned_paths(output_path, manifest_name)
    staged_paths = {p.relative_to(staging).as_posix() for p in staging.rglob("*")
                    if not p.is_dir() or p.is_symlink()}
    write_atomic(journal, json.dumps({"files": [{"path": p}
                                                for p in sorted(ours | staged_paths)]}))
    (output_path / manifest_name).unlink(missing_ok=True)
    ours_top = {path.split("/", 1)[0] for path in ours}
    for child in list(output_path.iterdir()):
        if child == staging or child.name.startswith(STAGING_PREFIX) \
                or child.name in VOLUME_ENTRIES:
            continue
        if child.name in ours_top or child.name.startswith(_BOOKKEEPING_PREFIX):
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    for child in sorted(staging.iterdir(), key=lambda p: p.name == manifest_name):
        # Staged outside a mount we did not see: a rename cannot cross it.
        try:
            os.replace(child, output_path / child.name)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            shutil.move(child, output_path / child.name)
    journal.unlink()
    staging.rmdir()
