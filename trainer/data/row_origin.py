"""Where a row of a loaded split came from: its data file and its row number there, so a
dropped row is named as the user finds it ("train.jsonl row 3").

``datasets`` loads a split's files in the order given and keeps no file per row, so the
rows are counted per file (``dataset_rows``: exact for parquet, arrow and JSON Lines, the
rows without blank lines, as ``datasets`` skips them) and the index is placed among the
counts. Where a count is not exact, or the counts do not add up to the rows loaded (a
filter, a remote source), a row is named by its number in the split instead.
"""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any, Callable

from kubetune.trainer.data import dataset_rows


def _files(data_files: Any, split: str) -> list[Path]:
    """The split's data files as ``load_dataset`` reads them."""
    if isinstance(data_files, (str, Path)):
        return [Path(data_files)]
    if isinstance(data_files, dict) or hasattr(data_files, "keys"):
        return _files(data_files.get(split), split) if data_files.get(split) else []
    if isinstance(data_files, (list, tuple)) or hasattr(data_files, "__iter__"):
        return [Path(str(f)) for f in data_files]
    return []


def namer(data_files: Any, split: str, total: int) -> Callable[[int], str]:
    """index (from 0, in the loaded split) -> "file row N" (from 1), else "row N"."""
    files = [f for f in _files(data_files, split) if f.is_file()]
    counts = []
    for path in files:
        try:
            found = dataset_rows.look(path, 0)
        except Exception:  # unreadable here: the loader has read it, so name by split row
            return _by_split_row
        if found.count is None or not found.exact:
            return _by_split_row
        counts.append(found.count)
    if not files or sum(counts) != total:
        return _by_split_row
    starts = [sum(counts[:i]) for i in range(len(counts))]

    def name(index: int) -> str:
        at = bisect.bisect_right(starts, index) - 1
        return f"{files[at].name} row {index - starts[at] + 1}"

    return name


def _by_split_row(index: int) -> str:
    return f"row {index + 1}"
