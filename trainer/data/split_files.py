"""The data files of a ``dataset.data_dir``, by split, as ``datasets`` names them.

Given a directory, ``datasets.load_dataset("parquet", data_dir=...)`` reads every file its
split patterns match, whatever the file is: a hub dataset's ``LICENSE`` or ``README.txt``
beside the shards is handed to the parquet reader ("ArrowInvalid: Parquet file size is 6
bytes"). So the trainer names the files itself: ``datasets``' own split patterns, kept to
the suffixes of the builder that reads them.
"""

from __future__ import annotations

from pathlib import Path


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
