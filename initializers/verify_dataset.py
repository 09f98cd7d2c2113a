"""Find a downloaded dataset's data files, check they read, describe them for the trainer."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from kubetune.errors import BadInputError
from kubetune.workspace import DATASET_DESCRIPTOR_NAME

FORMAT_OF_SUFFIX = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv",
                    ".arrow": "arrow"}


def _read_table(path: Path, fmt: str):
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
    try:
        import pyarrow.json as pjson

        return pjson.read_json(path)  # JSON Lines
    except pa.ArrowInvalid:
        records = json.loads(path.read_text())
        if isinstance(records, dict):
            records = next((v for v in records.values() if isinstance(v, list)), [records])
        return pa.Table.from_pylist(records)


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
    rows, columns = 0, None
    for path in by_format[fmt]:
        try:
            table = _read_table(path, fmt)
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
