"""Point the recipe's dataset at local files, never at a hub.

The trainer is offline by design. Where the arguments name the data (``dataset.data_dir``
or ``dataset.data_files``) we check it exists, repairing what upstream crashes on
(``data_dir=/workspace/dataset/.``). Where they name none, the dataset initializer's
descriptor says which files it wrote and in which format.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from omegaconf import DictConfig, ListConfig

from kubetune.errors import BadInputError
from kubetune.workspace import DATASET_DESCRIPTOR_NAME

# Hugging Face `datasets` builder for each file format the dataset initializer records.
BUILDER_FOR_FORMAT = {"parquet": "parquet", "json": "json", "jsonl": "json", "csv": "csv",
                      "arrow": "arrow"}


def read_descriptor(dataset_dir: Path) -> dict | None:
    path = Path(dataset_dir) / DATASET_DESCRIPTOR_NAME
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BadInputError(f"dataset descriptor {path} is unreadable: {exc}") from None


def _scan(dataset_dir: Path) -> dict | None:
    """Without a descriptor (a directory not written by our initializer), the data files
    of the one format it holds, if it holds exactly one."""
    if not dataset_dir.is_dir():
        return None
    by_format: dict[str, list[str]] = {}
    for path in sorted(dataset_dir.rglob("*")):
        rel = path.relative_to(dataset_dir)
        fmt = path.suffix.lstrip(".")
        if path.is_file() and fmt in BUILDER_FOR_FORMAT and not any(
                part.startswith(".") for part in rel.parts):
            by_format.setdefault(BUILDER_FOR_FORMAT[fmt], []).append(str(rel))
    if len(by_format) != 1:
        return None
    (builder, files), = by_format.items()
    return {"format": builder, "files": files}


def locate(dataset_cfg: DictConfig, dataset_dir: Path) -> list[str]:
    """Fix ``dataset_cfg`` in place; return log lines saying what changed."""
    if not isinstance(dataset_cfg, DictConfig):
        return []  # a list of datasets: each names its own data
    notes: list[str] = []
    data_dir = dataset_cfg.get("data_dir")
    data_files = dataset_cfg.get("data_files")
    if data_dir:
        normalized = os.path.normpath(str(data_dir))
        if normalized != str(data_dir):
            notes.append(f"dataset.data_dir {data_dir} normalized to {normalized}")
            dataset_cfg.data_dir = normalized
        if not Path(normalized).is_dir():
            raise BadInputError(f"dataset.data_dir {normalized} does not exist: check the "
                                "dataset initializer's output or the path you passed")
        return notes
    if data_files:
        files = [data_files] if isinstance(data_files, str) else list(data_files)
        if isinstance(data_files, (dict, DictConfig)):
            files = [f for v in data_files.values() for f in ([v] if isinstance(v, str) else v)]
        missing = [f for f in files if not Path(str(f)).is_file()]
        if missing:
            raise BadInputError(f"dataset.data_files {missing[0]} does not exist")
        return notes
    descriptor = read_descriptor(dataset_dir) or _scan(Path(dataset_dir))
    if descriptor is None:
        source = dataset_cfg.get("source")
        raise BadInputError(
            f"no local dataset: {dataset_dir} has no {DATASET_DESCRIPTOR_NAME} and no "
            f"dataset.data_dir/data_files was given (dataset.source={source}); the trainer "
            "does not download: run the dataset initializer or pass dataset.data_dir"
        )
    builder = BUILDER_FOR_FORMAT.get(descriptor.get("format", ""))
    if builder is None:
        raise BadInputError(f"dataset descriptor names format {descriptor.get('format')!r}; "
                            f"supported: {', '.join(sorted(BUILDER_FOR_FORMAT))}")
    files = [str(Path(dataset_dir) / f) for f in descriptor.get("files", [])]
    dataset_cfg.source = builder
    dataset_cfg.data_files = ListConfig(files)
    notes.append(f"dataset: using the dataset initializer's {len(files)} {builder} file(s) "
                 f"under {dataset_dir} ({descriptor.get('rows', '?')} rows)")
    return notes
