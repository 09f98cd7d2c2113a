"""Find a downloaded dataset's data files, check they read, describe them for the trainer."""

from __future__ import annotations

import codecs
import json
from collections import defaultdict
from pathlib import Path

from kubetune import json_rows
from kubetune.errors import BadInputError
from kubetune.workspace import DATASET_DESCRIPTOR_NAME

FORMAT_OF_SUFFIX = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv",
                    ".arrow": "arrow"}


def _read_table(path: Path, fmt: str, shown: str):
    import pyarrow as pa

    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path)
    if fmt == "csv":
        import pyarrow.csv as pcsv

        return pcsv.read_csv(path)
    if fmt == "arrow":
        import pyarrow.ipc as ipc

        try:
            return ipc.open_stream(path).read_all()
        except pa.ArrowInvalid:
            return ipc.open_file(path).read_all()
    return _read_json(path, shown)


def _read_json(path: Path, shown: str):
    """A JSON array, an object holding the rows, or JSON Lines; a broken one is named by
    its line in the file (``kubetune.json_rows``), not by pyarrow's or json's count."""
    import pyarrow as pa
    import pyarrow.json as pjson

    if json_rows.starts_with(path) == b"[":
        array = json_rows.json_document(path, shown)
        try:
            return pa.Table.from_pylist(array)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # values of mixed types, as above
            return _JsonRows((0, row) for row in array if isinstance(row, dict))
    try:
        return pjson.read_json(path)  # JSON Lines
    except pa.ArrowInvalid as exc:
        try:
            records = json.loads(path.read_bytes())  # one object holding the rows
        except ValueError:
            # JSON Lines with a broken line: name it. None broken: the rows disagree on a
            # value's type (OpenAI's content as a string in one row, a list of parts in
            # another), which the trainer's reader (datasets) takes.
            return _JsonRows(json_rows.json_lines(path, shown))
        if isinstance(records, dict):
            records = next((v for v in records.values() if isinstance(v, list)), [records])
        return pa.Table.from_pylist(records)


class _JsonRows:
    """The rows of a JSON Lines file pyarrow cannot type as one table: what ``describe``
    reads of a table."""

    def __init__(self, rows) -> None:
        self.num_rows, self.column_names = 0, []
        for _, row in rows:
            self.num_rows += 1
            self.column_names += [c for c in row if c not in self.column_names]


TEXT_FORMATS = ("json", "csv")
_CHUNK = 1 << 20


def _check_utf8(path: Path, tree: Path) -> None:
    """pyarrow and the trainer's loaders read text as UTF-8; pyarrow passes some other
    encodings through (a Latin-1 "é" reads as-is here and fails in the trainer)."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    offset = 0
    with open(path, "rb") as handle:
        while True:
            chunk = handle.read(_CHUNK)
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as exc:
                raise BadInputError(f"data file {path.relative_to(tree)} is not UTF-8 text (byte "
                                    f"{offset + exc.start}): re-encode it as UTF-8") from None
            if not chunk:
                return
            offset += len(chunk)


def _holds_records(path: Path) -> bool:
    """Whether a file of a format the trainer will not read holds rows of its own (a
    README.json or dataset_info.json beside the shards is an object: metadata)."""
    if path.suffix.lower() != ".json":
        return True
    try:
        with open(path, "rb") as handle:
            return handle.read(_CHUNK).lstrip()[:1] == b"["
    except OSError:
        return True


def describe(tree: Path) -> dict:
    by_format: dict[str, list[Path]] = defaultdict(list)
    for path in sorted(tree.rglob("*")):
        fmt = FORMAT_OF_SUFFIX.get(path.suffix.lower())
        if fmt and path.is_file() and not path.name.startswith("."):
            by_format[fmt].append(path)
    if not by_format:
        raise BadInputError("no data files found (looked for "
                            f"{', '.join(sorted(FORMAT_OF_SUFFIX))})")
    # Several formats (a README.json beside parquet shards, say): the most bytes wins.
    fmt = max(by_format, key=lambda f: sum(p.stat().st_size for p in by_format[f]))
    ignored = [p for f, paths in by_format.items() if f != fmt for p in paths
               if _holds_records(p)]
    if ignored:
        # The trainer loads one format: rows in another would be dropped without a word.
        raise BadInputError(f"the dataset mixes formats: {fmt} files and "
                            f"{', '.join(p.relative_to(tree).as_posix() for p in ignored[:3])}"
                            f"{' ...' if len(ignored) > 3 else ''}, which the trainer would "
                            "ignore: keep one format (or filter with ALLOW/IGNORE_PATTERNS)")
    rows, columns = 0, None
    for path in by_format[fmt]:
        shown = f"data file {path.relative_to(tree)}"
        if json_rows.is_blank(path):
            raise json_rows.empty_file_error(shown)
        if fmt in TEXT_FORMATS:
            _check_utf8(path, tree)
        try:
            table = _read_table(path, fmt, shown)
        except BadInputError:
            raise
        except Exception as exc:
            raise BadInputError(f"data file {path.relative_to(tree)} is unreadable as {fmt}: "
                                f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                                ) from None
        rows += table.num_rows
        columns = columns or table.column_names
    if rows == 0:
        raise BadInputError(f"the dataset's {fmt} files hold no rows")
    return {
        "format": fmt,
        "files": [p.relative_to(tree).as_posix() for p in by_format[fmt]],
        "rows": rows,
        "columns": columns,
    }


def write_descriptor(tree: Path, descriptor: dict) -> None:
    (tree / DATASET_DESCRIPTOR_NAME).write_text(json.dumps(descriptor, indent=2))
