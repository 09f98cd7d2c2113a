"""How many rows a dataset has and what a spread of them looks like, without reading it.

For each data file: its columns, the first rows (a sample) and a row count, taken the
cheapest way its format allows:

- parquet: the footer's row count (metadata only; exact);
- arrow (IPC file or stream, as ``datasets`` writes it): the record batches' headers on a
  memory map (zero-copy: the column buffers are never paged in; exact);
- jsonl: every line parsed in a streamed read (exact; a broken line is named by its
  number here, before the recipe's loader meets it);
- csv: newlines counted in a streamed binary read, no parsing, less the header; values
  holding line breaks (quoted multi-line answers) are corrected for by the sampled rows'
  mean line breaks per row (exact when no sampled value holds one, otherwise an estimate);
- json array: a bounded parse -- the whole array when the file is at most
  ``_JSON_PARSE_BYTES``, else elements parsed from its head and the count estimated from
  the file size over their mean size in bytes.

A file larger than ``_COUNT_BYTES`` is counted (and a JSON Lines file checked) on its first
``_COUNT_BYTES`` and extrapolated by size: the count only decides speed defaults
(packing), never correctness. An empty file (nothing but whitespace) is refused by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kubetune import json_rows
from kubetune.errors import BadInputError

FORMAT_OF_SUFFIX = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv",
                    ".arrow": "arrow"}
_CHUNK = 1 << 20
_COUNT_BYTES = 1 << 30
_JSON_PARSE_BYTES = 8 << 20
_JSON_HEAD_BYTES = 1 << 20


@dataclass
class FileRows:
    columns: list[str]
    rows: list[dict]  # the file's first rows, up to the number asked for
    count: int | None
    exact: bool


def look(path: Path, sample_rows: int) -> FileRows:
    """Columns, the first ``sample_rows`` rows and the row count of one data file."""
    reader = _READERS.get(FORMAT_OF_SUFFIX.get(path.suffix))
    if reader is None:
        return FileRows([], [], None, False)
    if json_rows.is_blank(path):
        # Every format's reader fails on it later, naming something else.
        raise json_rows.empty_file_error(f"dataset file {path}")
    try:
        return reader(path, sample_rows)
    except BadInputError:
        raise
    except Exception as exc:  # pyarrow and json raise many kinds
        raise BadInputError(f"dataset file {path} is unreadable: {exc}") from None


def _parquet(path: Path, n: int) -> FileRows:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    batch = next(pf.iter_batches(batch_size=max(1, n)), None)
    rows = batch.to_pylist()[:n] if batch is not None else []
    return FileRows(list(pf.schema_arrow.names), rows, pf.metadata.num_rows, True)


def _arrow(path: Path, n: int) -> FileRows:
    import pyarrow as pa

    with pa.memory_map(str(path)) as source:
        try:
            reader = pa.ipc.open_file(source)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            schema = reader.schema
        except pa.ArrowInvalid:  # no file footer: the stream format `datasets` writes
            source.seek(0)
            stream = pa.ipc.open_stream(source)
            batches, schema = iter(stream), stream.schema
        rows: list[dict] = []
        count = 0
        for batch in batches:
            if len(rows) < n:
                rows += batch.slice(0, n - len(rows)).to_pylist()
            count += batch.num_rows
    return FileRows(list(schema.names), rows, count, True)


def _newlines(path: Path) -> tuple[int, bool]:
    """Line count of a file (a last line without a newline counts), and whether exact."""
    size = path.stat().st_size
    lines, read, last = 0, 0, b"\n"
    with open(path, "rb") as f:
        while read < _COUNT_BYTES:
            chunk = f.read(_CHUNK)
            if not chunk:
                break
            lines += chunk.count(b"\n")
            read += len(chunk)
            last = chunk[-1:]
    if read < size:
        return round(lines * size / read), False
    return lines + (last != b"\n"), True


def _csv(path: Path, n: int) -> FileRows:
    import pyarrow as pa
    import pyarrow.csv as pcsv

    columns = list(pcsv.open_csv(path, read_options=pcsv.ReadOptions(block_size=_CHUNK)
                                 ).schema.names)
    # Every column as text, as the trainer reads a CSV (`csv_text`): "2" is an answer.
    reader = pcsv.open_csv(path, read_options=pcsv.ReadOptions(block_size=_CHUNK),
                           convert_options=pcsv.ConvertOptions(
                               column_types={c: pa.string() for c in columns}))
    rows: list[dict] = []
    for batch in reader:
        rows += batch.slice(0, n - len(rows)).to_pylist()
        if len(rows) >= n:
            break
    lines, exact = _newlines(path)
    data_lines = max(0, lines - 1)
    breaks = sum(str(v).count("\n") for row in rows for v in row.values())
    if breaks and rows:
        return FileRows(columns, rows, round(data_lines / (1 + breaks / len(rows))), False)
    return FileRows(columns, rows, data_lines, exact)


def _json(path: Path, n: int) -> FileRows:
    if json_rows.starts_with(path) != b"[":
        return _jsonl(path, n)
    size = path.stat().st_size
    if size <= _JSON_PARSE_BYTES:
        array = json_rows.json_document(path, f"dataset file {path}")
        return FileRows(list(array[0]) if array else [], array[:n], len(array), True)
    with open(path, "rb") as f:
        head = f.read(_JSON_HEAD_BYTES).decode("utf-8", "ignore")
    decoder = json.JSONDecoder()
    pos = head.index("[") + 1
    start, rows = pos, []
    while True:
        while pos < len(head) and head[pos] in " \t\r\n,":
            pos += 1
        try:
            row, pos = decoder.raw_decode(head, pos)
        except ValueError:
            break  # the head ends inside an element
        rows.append(row)
    if not rows:
        raise BadInputError(f"dataset file {path}: no JSON object in its first "
                            f"{_JSON_HEAD_BYTES >> 20} MiB")
    count = round(size / ((pos - start) / len(rows)))
    return FileRows(list(rows[0]), rows[:n], count, False)


def _jsonl(path: Path, n: int) -> FileRows:
    """Every line parsed (up to ``_COUNT_BYTES``), not only the sampled ones: a broken
    line anywhere fails here with its number, not in the recipe's loader."""
    rows: list[dict] = []
    count, read = 0, 0
    for read, row in json_rows.json_lines(path, f"dataset file {path}", _COUNT_BYTES):
        count += 1
        if len(rows) < n:
            rows.append(row)
    size = path.stat().st_size
    if read < size:
        return FileRows(list(rows[0]) if rows else [], rows, round(count * size / read), False)
    return FileRows(list(rows[0]) if rows else [], rows, count, True)


# A reader per format FORMAT_OF_SUFFIX names.
_READERS: dict[str | None, Callable[[Path, int], FileRows]] = {
    "parquet": _parquet, "arrow": _arrow, "csv": _csv, "json": _json}
