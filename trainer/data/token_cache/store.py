"""The cache directory on the volume: one entry per key, built once, by one process.

- Built once per node (and per volume): the key's lock (``kubetune.file_lock``) is taken by
  every process that wants the entry; the first builds it while the others wait, then all
  map it. A restarted pod, or the next TrainJob on the same volume, maps it at once.
  Several nodes on one ReadWriteMany volume take the same lock.
- Never half-written: an entry is built in a staging directory beside it, its files
  fsynced, its record written last, and renamed into place; ``rows.open_entry`` trusts
  nothing without a record whose sizes match. A builder killed at any point leaves only a
  staging directory, which the next builder removes (it holds the lock, so no one else
  is writing it).
- Never fatal: a volume that cannot hold it (read-only, full, no locks) gets one warning,
  and the rows are built in a private temporary directory (mapped, then unlinked: the
  mapping keeps them until the process ends), else in memory. A complete entry on a
  read-only volume is still mapped.
- Bounded: after a build, entries unused for ``MAX_IDLE_DAYS`` days, and those beyond the
  ``MAX_ENTRIES`` most recently used, are removed, except any a process has mapped: each
  holds a shared ``flock`` on the entry's ``in-use`` file for as long as it runs, and the
  remover needs the exclusive one (and the entry's key lock).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from kubetune import file_lock
from kubetune.atomic_write import fsync_path
from kubetune.workspace import STAGING_PREFIX
from kubetune.trainer.data.token_cache.key import KEY_LENGTH
from kubetune.trainer.data.token_cache.rows import (IN_USE_NAME, CacheUnusable, EntryWriter,
                                                    MemoryWriter, TokenRows, open_entry)

log = logging.getLogger("trainer")

MAX_ENTRIES = 8
MAX_IDLE_DAYS = 14
TRASH_PREFIX = ".kubetune-trash-"
# Where a build may be killed by the test hook (KUBETUNE_TEST_KILL_TOKEN_CACHE_AT).
KILL_POINTS = ("tokenizing", "before-record", "before-rename")

# Tokenizes into the writer; the flag: into the shared entry (this node's other processes
# wait meanwhile), not a private copy.
Produce = Callable[[EntryWriter | MemoryWriter, bool], None]


def kill_point(name: str, kill_at: str | None) -> None:
    """Tests only: SIGKILL this process here when the hook (``kill_at``, the recipe
    process's KUBETUNE_TEST_KILL_TOKEN_CACHE_AT: ``CacheSettings.test_kill_at``) names
    ``name``."""
    if kill_at == name:
        print(f"token cache: killing the builder at {name}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def _lock_path(root: Path, key: str) -> Path:
    return root / f"{key}.lock"


def _staging_name(key: str) -> str:
    return f"{STAGING_PREFIX}{key}-{socket.gethostname()}-{os.getpid()}"


def _hold(rows: TokenRows) -> TokenRows:
    """Mark the entry in use for as long as this process lives (and note when it was used)."""
    try:
        path = rows.where / IN_USE_NAME
        handle = open(path, "rb")
        fcntl.flock(handle, fcntl.LOCK_SH)
        rows._holds.append(handle)
        os.utime(path)
    except OSError:
        pass  # a read-only volume: nobody prunes it either
    return rows


def _build_in(directory: Path, produce: Produce, shared: bool,
              kill_at: str | None = None) -> None:
    """Build the entry into ``directory`` (which must not exist); removed on any failure."""
    try:
        directory.mkdir()
    except OSError as exc:
        raise CacheUnusable(exc.strerror or str(exc)) from exc
    writer = None
    try:
        writer = EntryWriter(directory, before_record=lambda: kill_point("before-record", kill_at))
        produce(writer, shared)
    except BaseException:
        if writer is not None:
            writer.abandon()
        shutil.rmtree(directory, ignore_errors=True)
        raise


def _remove_leftovers(root: Path, key: str) -> None:
    """What a killed builder or remover of ``key`` left (the caller holds its lock)."""
    for path in root.glob(f"{STAGING_PREFIX}{key}-*"):
        shutil.rmtree(path, ignore_errors=True)


def _move_aside(entry: Path) -> None:
    trash = entry.parent / f"{TRASH_PREFIX}{entry.name}-{os.getpid()}"
    os.rename(entry, trash)
    shutil.rmtree(trash, ignore_errors=True)


def _shared(root: Path, key: str, produce: Produce,
            kill_at: str | None = None) -> tuple[TokenRows, bool]:
    entry = root / key
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = file_lock.hold(_lock_path(root, key), on_wait=lambda holder: log.info(
            "token cache: %s is building %s; waiting to map it", holder, entry))
        lock.__enter__()
    except OSError as exc:
        found = open_entry(entry, key)  # a read-only volume may still hold it, complete
        if found is not None:
            return _hold(found), False
        raise CacheUnusable(exc.strerror or str(exc)) from exc
    try:
        found = open_entry(entry, key)
        if found is not None:
            return _hold(found), False
        staging = root / _staging_name(key)
        try:
            _remove_leftovers(root, key)
            if entry.exists():  # damaged (its sizes disagree with its record)
                _move_aside(entry)
            _build_in(staging, produce, shared=True, kill_at=kill_at)
            kill_point("before-rename", kill_at)
            os.rename(staging, entry)
            fsync_path(root)
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise CacheUnusable(exc.strerror or str(exc)) from exc
        built = open_entry(entry, key)
        if built is None:
            raise CacheUnusable("the entry just written does not read back")
        prune(root, keep=key)
        return _hold(built), True
    finally:
        lock.__exit__(None, None, None)


def _private(key: str, produce: Produce, kill_at: str | None = None) -> TokenRows:
    """Built in a temporary directory of this process's own, mapped, then unlinked."""
    try:
        scratch = Path(tempfile.mkdtemp(prefix="kubetune-tokens-"))
    except OSError as exc:
        raise CacheUnusable(exc.strerror or str(exc)) from exc
    try:
        _build_in(scratch / key, produce, shared=False, kill_at=kill_at)
        rows = open_entry(scratch / key, key)
        if rows is None:
            raise CacheUnusable("the entry just written does not read back")
        return rows
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # the mapping keeps the pages


def _in_memory(produce: Produce) -> TokenRows:
    writer = MemoryWriter()
    produce(writer, False)
    return writer.rows


def obtain(root: Path | None, key: str, produce: Produce, warn: Callable[[str], None],
           kill_at: str | None = None) -> tuple[TokenRows, bool]:
    """The rows of ``key``: mapped from ``root``'s entry, built there first if missing;
    where ``root`` cannot hold it, built privately (one ``warn`` line). Returns the rows
    and whether this call built them. ``produce(writer)`` tokenizes into the writer."""
    reason = "no cache directory"
    if root is not None:
        try:
            return _shared(Path(root), key, produce, kill_at)
        except CacheUnusable as exc:
            reason = f"{root} cannot hold it ({exc})"
    try:
        rows, where = _private(key, produce, kill_at), "a private temporary directory"
    except CacheUnusable:
        rows, where = _in_memory(produce), "memory"
    warn(f"token cache: {reason}: tokenized into {where} for this process only (the run "
         "goes on; the next one tokenizes again)")
    return rows, True


def _last_used(entry: Path) -> float:
    try:
        return (entry / IN_USE_NAME).stat().st_mtime
    except OSError:
        return 0.0


def _is_entry(path: Path) -> bool:
    return len(path.name) == KEY_LENGTH and path.is_dir() and all(
        c in "0123456789abcdef" for c in path.name)


def prune(root: Path, keep: str, max_entries: int = MAX_ENTRIES,
          max_idle_days: float = MAX_IDLE_DAYS) -> list[str]:
    """Remove stale entries (see the module's docstring); returns the keys removed."""
    try:
        entries = sorted((p for p in root.iterdir() if _is_entry(p)), key=_last_used,
                         reverse=True)
        for trash in root.glob(f"{TRASH_PREFIX}*"):
            shutil.rmtree(trash, ignore_errors=True)  # a remover killed mid-way
    except OSError:
        return []
    idle_since = time.time() - max_idle_days * 86400
    removed = []
    for rank, entry in enumerate(entries):
        if entry.name == keep or (rank < max_entries and _last_used(entry) >= idle_since):
            continue
        try:
            with file_lock.hold(_lock_path(root, entry.name), wait=False), \
                    open(entry / IN_USE_NAME, "rb") as in_use:
                fcntl.flock(in_use, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while mapped
                _move_aside(entry)
            removed.append(entry.name)
        except (file_lock.LockHeld, OSError):
            continue
    return removed
