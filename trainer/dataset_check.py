"""Look at the dataset files before launch: do their columns fit the recipe's dataset
builder and column map, and how long are the samples (for the packing default)?

Reads only a file's schema and a few hundred rows, with pyarrow, never the whole set.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from kubetune.errors import BadInputError

_SUFFIXES = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv",
             ".arrow": "arrow"}
_SAMPLE_ROWS = 512


@dataclass
class DatasetSample:
    files: list[Path]
    columns: list[str]
    rows: list[dict]  # up to _SAMPLE_ROWS rows of the first file
    total_rows: int | None  # when the format says it cheaply (parquet)


def _files(dataset_cfg: DictConfig) -> list[Path]:
    data_files = dataset_cfg.get("data_files")
    if data_files:
        if isinstance(data_files, str):
            return [Path(data_files)]
        container = OmegaConf.to_container(data_files) if not isinstance(data_files, list) \
            else data_files
        if isinstance(container, dict):
            flat = []
            for v in container.values():
                flat += [v] if isinstance(v, str) else list(v)
            return [Path(f) for f in flat]
        return [Path(str(f)) for f in container]
    data_dir = dataset_cfg.get("data_dir")
    if data_dir:
        return sorted(p for p in Path(str(data_dir)).rglob("*")
                      if p.suffix in _SUFFIXES and p.is_file()
                      and not any(part.startswith(".") for part in p.parts[-2:]))
    return []


def _read(path: Path) -> tuple[list[str], list[dict], int | None]:
    kind = _SUFFIXES.get(path.suffix)
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            pf = pq.ParquetFile(path)
            batch = next(pf.iter_batches(batch_size=_SAMPLE_ROWS), None)
            rows = batch.to_pylist() if batch is not None else []
            return list(pf.schema_arrow.names), rows, pf.metadata.num_rows
        if kind == "json":
            rows = []
            with open(path, encoding="utf-8") as f:
                head = f.read(1)
                f.seek(0)
                if head == "[":
                    rows = json.load(f)[:_SAMPLE_ROWS]
                else:
                    for line in f:
                        if line.strip():
                            rows.append(json.loads(line))
                        if len(rows) >= _SAMPLE_ROWS:
                            break
            columns = list(rows[0]) if rows else []
            return columns, rows, None
        if kind == "csv":
            import pyarrow.csv as pcsv

            table = pcsv.read_csv(path)
            return list(table.column_names), table.slice(0, _SAMPLE_ROWS).to_pylist(), \
                table.num_rows
        if kind == "arrow":
            import pyarrow as pa

            with pa.memory_map(str(path)) as source:
                table = pa.ipc.open_stream(source).read_all()
            return list(table.column_names), table.slice(0, _SAMPLE_ROWS).to_pylist(), \
                table.num_rows
    except Exception as exc:  # pyarrow and json raise many kinds
        raise BadInputError(f"dataset file {path} is unreadable: {exc}") from None
    return [], [], None


def sample(dataset_cfg: DictConfig) -> DatasetSample | None:
    if not isinstance(dataset_cfg, DictConfig):
        return None
    files = _files(dataset_cfg)
    if not files:
        return None
    columns, rows, total = _read(files[0])
    return DatasetSample(files=files, columns=columns, rows=rows,
                         total_rows=total if len(files) == 1 else None)


def required_columns(dataset_cfg: DictConfig) -> dict[str, str]:
    """Column the builder reads -> its role, after the column map, for builders we know."""
    component = str(dataset_cfg.get("_component_", ""))
    name = component.rsplit(".", 1)[-1]
    column_map = dataset_cfg.get("column_map")
    column_map = OmegaConf.to_container(column_map) if isinstance(column_map, DictConfig) \
        else (column_map or {})
    if not isinstance(column_map, dict):
        raise BadInputError(f"dataset.column_map must map a role to a column, e.g. "
                            f"{{'input': 'question', 'output': 'answer'}}; got {column_map!r}")
    roles: tuple[str, ...]
    if name == "instruct_dataset":
        roles = ("input", "output")
    elif name in ("alpaca_dataset", "alpaca_cleaned_dataset"):
        roles = ("instruction", "input", "output")
    elif name == "text_completion_dataset":
        return {str(dataset_cfg.get("column", "text")): "text"}
    elif name == "chat_dataset":
        column = dataset_cfg.get("conversation_column")
        if not column:
            raise BadInputError("dataset chat_dataset needs dataset.conversation_column: the "
                                "column that holds each conversation")
        return {str(column): "conversation"}
    else:
        return {}
    return {str(column_map.get(role, role)): role for role in roles}


def check_columns(dataset_cfg: DictConfig, found: DatasetSample) -> None:
    required = required_columns(dataset_cfg)
    missing = [col for col in required if col not in found.columns]
    if missing:
        roles = ", ".join(f"{required[c]}->{c}" for c in missing)
        raise BadInputError(
            f"dataset {found.files[0].name} has columns {found.columns} but the recipe reads "
            f"{roles}: set dataset.column_map (e.g. dataset.column_map="
            f"{{'{required[missing[0]]}': '<column>'}})"
        )


def mean_chars(dataset_cfg: DictConfig, found: DatasetSample) -> float | None:
    columns = list(required_columns(dataset_cfg)) or found.columns
    if not found.rows:
        return None
    total = 0
    for row in found.rows:
        total += sum(len(str(row.get(c, ""))) for c in columns)
    return total / len(found.rows)
