"""The data files of a dataset directory, by split, as ``datasets`` names them.

Given a directory, ``datasets.load_dataset("parquet", data_dir=...)`` reads every file its
split patterns match, whatever the file is: a hub dataset's ``LICENSE`` or ``README.txt``
beside the shards is handed to the parquet reader ("ArrowInvalid: Parquet file size is 6
bytes"). So the trainer names the files itself: ``datasets``' own split patterns, kept to
the suffixes of the builder that reads them. A list of files (the dataset initializer's
descriptor, a scanned directory) is split by the same patterns (``splits_of``): a hub
layout's ``data/test-00000-of-00001.parquet`` is its test split, never training data.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath


def split_files(data_dir: Path, suffixes: list[str]) -> dict[str, list[str]]:
    """Split -> the files with one of ``suffixes`` that ``datasets`` would read for it
    from ``data_dir`` (absolute paths); every such file under "train" where its patterns
    name none; empty where the directory holds none."""
    # Imported here: only a data_dir needs it, and it costs the launcher a second.
    from datasets.data_files import DataFilesDict, get_data_patterns

    base = str(Path(data_dir).resolve())
    try:
        patterns = get_data_patterns(base)
    except FileNotFoundError:  # a directory holding no file at all
        return {}
    found = DataFilesDict.from_patterns(patterns, base_path=base, allowed_extensions=suffixes)
    by_split = {str(split): [str(f) for f in files] for split, files in found.items() if files}
    if by_split:
        return by_split
    # The patterns matched only other files (notes_train.txt beside data.parquet).
    rest = sorted(str(p) for p in Path(base).rglob("*") if p.is_file()
                  and p.suffix in suffixes
                  and not any(part.startswith(".") for part in p.relative_to(base).parts))
    return {"train": rest} if rest else {}


def splits_of(files: list[str]) -> dict[str, list[str]]:
    """Split -> the files of ``files`` (paths relative to one directory, ``/``-separated)
    that ``datasets``' default patterns give it, in the order given; all of them under
    "train" where the patterns name no split."""
    # Imported here, as above; fsspec's glob semantics are the ones datasets resolves with.
    from datasets.data_files import _get_data_files_patterns
    from fsspec.utils import glob_translate

    posix = [PurePosixPath(f).as_posix() for f in files]

    def matching(pattern: str) -> list[str]:
        regex = re.compile(glob_translate(pattern))
        return [f for f in posix if regex.match(f)]

    def resolver(pattern: str) -> list[str]:
        found = matching(pattern)
        if not found:
            raise FileNotFoundError(pattern)
        return found

    try:
        patterns = _get_data_files_patterns(resolver)
    except FileNotFoundError:
        return {"train": list(files)} if files else {}
    by_split: dict[str, list[str]] = {}
    for split, split_patterns in patterns.items():
        chosen = {f for pattern in split_patterns for f in matching(pattern)}
        picked = [orig for orig, f in zip(files, posix) if f in chosen]
        if picked:
            by_split[str(split)] = picked
    return by_split or {"train": list(files)}
