"""Tokenized rows as flat arrays: every kept row's tokens, then its labels, end to end, and
where each row starts. On disk one cache entry is a directory of raw little-endian files
(``tokens.i32``, ``labels.i32``, ``offsets.i64``; ``packs.i64``, the pack boundaries, when
the dataset packs) and ``meta.json``, the completion record, written last: an entry
without it, or whose files' sizes disagree with it, is not an entry (``open_entry``).

Mapped read-only, the files' pages are the kernel's page cache, shared by every process of
the node that maps them, read as batches ask for them, never copied per process.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from kubetune.atomic_write import fsync_path

FORMAT_VERSION = 1  # of the files below; part of every key, so a new layout is a new entry
META_NAME = "meta.json"
TOKENS_NAME = "tokens.i32"
LABELS_NAME = "labels.i32"
OFFSETS_NAME = "offsets.i64"
PACKS_NAME = "packs.i64"
IN_USE_NAME = "in-use"  # share-locked by every process mapping the entry; its mtime: last use
_DTYPES = {TOKENS_NAME: np.dtype("<i4"), LABELS_NAME: np.dtype("<i4"),
           OFFSETS_NAME: np.dtype("<i8"), PACKS_NAME: np.dtype("<i8")}


@dataclass
class TokenRows:
    """The kept rows, and what their build counted (``meta``: rows read, dropped, cut)."""

    tokens: np.ndarray
    labels: np.ndarray
    offsets: np.ndarray  # len(rows) + 1
    meta: dict
    packs: np.ndarray | None = None  # pack boundaries (``packs.pack_bounds``), if packed
    where: Path | None = None  # the entry's directory; None: built in memory
    _holds: list = field(default_factory=list)  # open files that keep the entry in use

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def row(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        return self.tokens[start:end], self.labels[start:end]


def expected_sizes(meta: dict) -> dict[str, int]:
    """Each file's size in bytes, as the completion record says it must be."""
    sizes = {TOKENS_NAME: 4 * int(meta["tokens"]), LABELS_NAME: 4 * int(meta["tokens"]),
             OFFSETS_NAME: 8 * (int(meta["rows"]) + 1)}
    if meta.get("packing") is not None:
        sizes[PACKS_NAME] = 8 * (int(meta["packs"]) + 1)
    return sizes


def read_meta(entry: Path) -> dict | None:
    try:
        meta = json.loads((entry / META_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == FORMAT_VERSION else None


def open_entry(entry: Path, key: str) -> TokenRows | None:
    """The entry's rows, mapped; None when it is incomplete, of another key or format, or
    its files are not the sizes its record names (a cheap check: no data is read)."""
    meta = read_meta(entry)
    if meta is None or meta.get("key") != key:
        return None
    try:
        sizes = expected_sizes(meta)
        if any(os.stat(entry / name).st_size != size for name, size in sizes.items()):
            return None
        arrays = {name: _map(entry / name, _DTYPES[name], size)
                  for name, size in sizes.items()}
    except (OSError, KeyError, TypeError, ValueError):
        return None
    return TokenRows(tokens=arrays[TOKENS_NAME], labels=arrays[LABELS_NAME],
                     offsets=arrays[OFFSETS_NAME], meta=meta, packs=arrays.get(PACKS_NAME),
                     where=entry)


def _map(path: Path, dtype: np.dtype, size: int) -> np.ndarray:
    if size == 0:  # mmap cannot map an empty file
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


class CacheUnusable(Exception):
    """The cache's volume cannot hold an entry (read-only, full, no locks): the caller
    tokenizes somewhere else; the cause is the OSError it is raised from."""


def _on_volume(action: Callable[[], object]):
    try:
        return action()
    except OSError as exc:
        raise CacheUnusable(f"{exc.strerror or exc}") from exc


class EntryWriter:
    """Writes one entry into ``directory`` (a staging directory: renamed into place only
    once ``finish`` has written the record). Any failure of the volume: ``CacheUnusable``."""

    def __init__(self, directory: Path, before_record: Callable[[], None] = lambda: None) -> None:
        self.directory = directory
        self._before_record = before_record
        self._files = _on_volume(lambda: [open(directory / TOKENS_NAME, "xb"),
                                          open(directory / LABELS_NAME, "xb")])

    def write(self, tokens: np.ndarray, labels: np.ndarray) -> None:
        _on_volume(lambda: (self._files[0].write(_bytes(tokens, TOKENS_NAME)),
                            self._files[1].write(_bytes(labels, LABELS_NAME))))

    def finish(self, offsets: np.ndarray, packs: np.ndarray | None, meta: dict) -> None:
        def data_files() -> None:
            for handle in self._files:
                handle.flush()
                os.fsync(handle.fileno())
                handle.close()
            for name, values in ((OFFSETS_NAME, offsets), (PACKS_NAME, packs)):
                if values is not None:
                    _write_synced(self.directory / name, _bytes(values, name))
            _write_synced(self.directory / IN_USE_NAME, b"")

        _on_volume(data_files)
        self._before_record()
        _on_volume(lambda: (_write_synced(self.directory / META_NAME,
                                          json.dumps(meta, indent=1).encode()),
                            fsync_path(self.directory)))

    def abandon(self) -> None:
        for handle in self._files:
            with contextlib.suppress(OSError):  # a full volume fails the flush on close too
                handle.close()


class MemoryWriter:
    """The same rows kept in this process's memory: where no directory can hold them."""

    def __init__(self) -> None:
        self._parts: tuple[list, list] = ([], [])
        self.rows: TokenRows | None = None

    def write(self, tokens: np.ndarray, labels: np.ndarray) -> None:
        self._parts[0].append(tokens)
        self._parts[1].append(labels)

    def finish(self, offsets: np.ndarray, packs: np.ndarray | None, meta: dict) -> None:
        tokens, labels = (np.concatenate(p) if p else np.zeros(0, np.int32)
                          for p in self._parts)
        self._parts = ([], [])
        self.rows = TokenRows(tokens=tokens, labels=labels, offsets=offsets, meta=meta,
                              packs=packs)

    def abandon(self) -> None:
        self._parts = ([], [])


def _bytes(values: np.ndarray, name: str) -> bytes:
    return np.ascontiguousarray(values, dtype=_DTYPES[name]).tobytes()


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "xb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
