"""Rows held out by their content: the same rows on every rank, every resume and every
re-run, whatever the order of the files or the sampler's shuffle.

A row's position in [0, 1) is a hash of its canonical JSON; with a held-out fraction f,
rows below f are the validation set and every other row is trained on. Nothing is stored:
the recipe process recomputes the positions from the rows it loads (identical rows share
a position, so a duplicated row never lands on both sides).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable, Mapping

SIDES = ("train", "val")
_BATCH = 1024


def row_position(row: Mapping) -> float:
    """``row``'s place in [0, 1): the first 8 bytes of the blake2b of its canonical JSON."""
    text = json.dumps(row, sort_keys=True, default=str, ensure_ascii=False)
    digest = hashlib.blake2b(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def held_out(row: Mapping, fraction: float) -> bool:
    return row_position(row) < fraction


def _rows(hf_dataset: Any) -> Iterable[Mapping]:
    """The dataset's rows as dicts; a Hugging Face dataset read a batch of columns at a
    time (row by row it decodes each row on its own, several times slower)."""
    iter_batches = getattr(hf_dataset, "iter", None)
    if callable(iter_batches):
        for batch in iter_batches(batch_size=_BATCH):
            names = list(batch)
            yield from (dict(zip(names, values)) for values in zip(*batch.values()))
        return
    yield from hf_dataset


def keep_indices(hf_dataset: Any, fraction: float, side: str) -> list[int]:
    """The indices of the rows ``side`` keeps: "train" those at or above ``fraction``,
    "val" those below it."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, not {side!r}")
    val = side == "val"
    return [i for i, row in enumerate(_rows(hf_dataset)) if held_out(row, fraction) == val]


# Rows counted exactly before launch up to this many (hashing costs a few µs a row).
COUNT_ROWS_LIMIT = 200_000
# Formats whose rows pyarrow reads as `datasets` does (JSON and CSV parsers may type a
# value differently: the count would be close, not exact).
_EXACT_SUFFIXES = (".parquet", ".arrow")


def count_held_out(files: list, fraction: float, total_rows: int | None) -> int | None:
    """How many of the rows in ``files`` a held-out ``fraction`` takes, counted as the
    recipe process will choose them; None where that is not cheap or not exact (other
    formats, more than ``COUNT_ROWS_LIMIT`` rows)."""
    from pathlib import Path

    paths = [Path(str(f)) for f in files]
    if total_rows is None or total_rows > COUNT_ROWS_LIMIT or not paths \
            or any(p.suffix not in _EXACT_SUFFIXES for p in paths):
        return None
    held = 0
    for path in paths:
        for batch in _batches(path):
            held += sum(held_out(row, fraction) for row in batch.to_pylist())
    return held


def _batches(path) -> Iterable:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.suffix == ".parquet":
        yield from pq.ParquetFile(path).iter_batches(batch_size=_BATCH)
        return
    with pa.memory_map(str(path)) as source:
        try:
            reader = pa.ipc.open_file(source)
            yield from (reader.get_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowInvalid:  # the stream format `datasets` writes
            source.seek(0)
            yield from pa.ipc.open_stream(source)
