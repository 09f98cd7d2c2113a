"""Point the recipe's dataset at local files, never at a hub.

The trainer is offline by design. Where the arguments name the data (``dataset.data_dir``
or ``dataset.data_files``) we check it exists, repairing what upstream crashes on
(``data_dir=/workspace/dataset/.``). Where they name none, the dataset initializer's
descriptor says which files it wrote and in which format. Either way the data on disk
decides ``dataset.source``: the Kubeflow SDK keeps the recipe config's hub repo
(``yahma/alpaca-cleaned``) or sends no source at all, and both would fail offline.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from kubetune.errors import BadInputError
from kubetune.workspace import DATASET_DESCRIPTOR_NAME
from kubetune.trainer.config.component_params import component_params
from kubetune.trainer.data.split_files import split_files, splits_of

# Hugging Face `datasets` builder for each file format the dataset initializer records.
BUILDER_FOR_FORMAT = {"parquet": "parquet", "json": "json", "jsonl": "json", "csv": "csv",
                      "arrow": "arrow"}
# `source` values `datasets` reads from local files (anything else is a hub repo id).
LOCAL_BUILDERS = {"parquet", "json", "csv", "arrow", "text"}


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


def _suffixes(builder: str) -> list[str]:
    if builder == "text":
        return [".txt"]
    return ["." + fmt for fmt, of in BUILDER_FOR_FORMAT.items() if of == builder]


def _name_data_files(dataset_cfg: DictConfig, data_dir: Path) -> list[str]:
    """``dataset.data_files``: the files of ``dataset.source``'s format in ``data_dir``, by
    split, so that no README, LICENSE or other file there is read as data."""
    source = str(dataset_cfg.get("source"))
    if source not in LOCAL_BUILDERS:
        return []  # a dataset directory or loading script of the user's: it says
    by_split = split_files(data_dir, _suffixes(source))
    others = sorted(p.relative_to(data_dir).as_posix() for p in data_dir.rglob("*")
                    if p.is_file() and not any(part.startswith(".")
                                               for part in p.relative_to(data_dir).parts)
                    and str(p.resolve()) not in {f for fs in by_split.values() for f in fs})
    shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
    if not by_split:
        raise BadInputError(
            f"dataset.data_dir {data_dir} holds no {source} data file "
            f"({'only ' + shown if others else 'it is empty'}): point dataset.data_dir at "
            f"the directory of the data files, or set dataset.source to their format")
    dataset_cfg.data_files = OmegaConf.create(by_split)
    if not others:
        return []
    return [f"dataset: reading the {source} files of {data_dir} only ({shown} left out)"]


def _format_of(files: list[str]) -> str | None:
    """The one `datasets` builder that reads all of ``files``, if there is one."""
    builders = {BUILDER_FOR_FORMAT.get(Path(str(f)).suffix.lstrip(".")) for f in files}
    return builders.pop() if len(builders) == 1 and None not in builders else None


def _read_locally(dataset_cfg: DictConfig, builder: str | None, where: str,
                  key: str = "dataset") -> list[str]:
    """Make ``<key>.source`` the builder of the local files at ``where``."""
    source = dataset_cfg.get("source")
    if source is not None and Path(str(source)).exists():
        return []  # a local dataset directory or loading script the user named
    if builder is None:
        if source in LOCAL_BUILDERS:
            return []
        raise BadInputError(
            f"{key} at {where}: no single data format (parquet, json, jsonl, csv, arrow) "
            f"to read, and {key}.source={source} is not a local format: set "
            f"{key}.source=parquet (or json, csv) or point {key}.data_files at the files")
    if source == builder:
        return []
    dataset_cfg.source = builder
    return [f"dataset: reading the local {builder} data at {where} "
            f"{_instead_of(dataset_cfg, source)}"]


def _instead_of(dataset_cfg: DictConfig, source) -> str:
    """What the config would have read: its source, else the builder's default one."""
    if source is None:
        component = str(dataset_cfg.get("_component_", ""))
        params = component_params(component) if component else None
        default = params.defaults.get("source") if params else None
        if not isinstance(default, str):
            return "(the config names no dataset.source)"
        return (f"instead of dataset.source={default} ({component.rsplit('.', 1)[-1]}'s "
                "default; the trainer never downloads)")
    return f"instead of dataset.source={source} (the trainer never downloads)"


def locate(dataset_cfg: DictConfig, dataset_dir: Path, key: str = "dataset") -> list[str]:
    """Fix ``dataset_cfg`` in place; return log lines saying what changed. ``key``: the
    section's name in the user's arguments (``dataset_val`` for the held-out set)."""
    if not isinstance(dataset_cfg, DictConfig):
        return []  # a list of datasets: each names its own data
    notes: list[str] = []
    data_dir = dataset_cfg.get("data_dir")
    data_files = dataset_cfg.get("data_files")
    if data_dir:
        normalized = os.path.normpath(str(data_dir))
        if normalized != str(data_dir):
            notes.append(f"{key}.data_dir {data_dir} normalized to {normalized}")
            dataset_cfg.data_dir = normalized
        if not Path(normalized).is_dir():
            raise BadInputError(f"{key}.data_dir {normalized} does not exist: check the "
                                "dataset initializer's output or the path you passed")
        found = _scan(Path(normalized))
        notes += _read_locally(dataset_cfg, found and found["format"], normalized, key)
        if data_files:  # the user's own, relative to data_dir
            return notes
        return notes + _name_data_files(dataset_cfg, Path(normalized))
    if data_files:
        if isinstance(data_files, str):
            files = [data_files]
        elif isinstance(data_files, (dict, DictConfig)):
            files = [f for v in data_files.values() for f in ([v] if isinstance(v, str) else v)]
        else:
            files = list(data_files)
        missing = [f for f in files if not Path(str(f)).is_file()]
        if missing:
            raise BadInputError(f"{key}.data_files {missing[0]} does not exist")
        where = str(files[0]) if len(files) == 1 else f"{len(files)} files"
        return notes + _read_locally(dataset_cfg, _format_of(files), where, key)
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
    by_split = {split: [str(Path(dataset_dir) / f) for f in files]
                for split, files in splits_of(list(descriptor.get("files", []))).items()}
    instead = _instead_of(dataset_cfg, dataset_cfg.get("source"))
    dataset_cfg.source = builder
    # By split, as `datasets` names them: `dataset.split` then picks one, and a hub
    # layout's test files are never read as training rows.
    dataset_cfg.data_files = OmegaConf.create(by_split)
    count = sum(len(files) for files in by_split.values())
    splits = ", ".join(f"{split} {len(files)}" for split, files in by_split.items())
    notes.append(f"dataset: using the dataset initializer's {count} {builder} file(s) "
                 f"under {dataset_dir} (by split: {splits}) {instead}")
    return notes
