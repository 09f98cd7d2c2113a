"""The cache key: a digest of every input that changes the tokens, so a change to any of
them is a new entry and no run ever trains on another configuration's rows.

- the data: each file the dataset config names (``data_files``, the files under
  ``data_dir`` or a local ``source``, any other absolute path in it), by path, size and
  modification time; where the dataset initializer's manifest lists the file at that size
  and the file is no newer than the manifest, by the manifest's sha256 instead (a copied
  or restored volume keeps its cache; an edit after the initializer changes the time);
- the dataset config, every parameter as given (component, column_map, train_on_input,
  split, conversation_* ..., packing);
- the tokenizer config (component, max_seq_len, prompt_template, ...) and the bytes of
  every file it names (tokenizer model, special tokens);
- code torchtune's version does not pin: the source file of every ``_component_`` outside
  torchtune (a user's builder, its transforms' module, our own model families, and the
  modules such a module lists in ``TOKENS_DEPEND_ON``);
- the loss's ignore index, the packing torchtune's builder chose, this cache's format,
  torchtune's and ``datasets``' versions.
"""

from __future__ import annotations

import calendar
import hashlib
import importlib
import importlib.metadata
import inspect
import json
import os
import time
from pathlib import Path
from typing import Any, Iterator

from kubetune.file_hash import sha256_of
from kubetune.trainer.config.saved_config import masked
from kubetune.workspace.initializer_manifest import read_manifest
from kubetune.trainer.data.token_cache.rows import FORMAT_VERSION

# Dataset parameters that name local data (datasets.load_dataset's own, and `source`).
DATA_KEYS = ("data_files", "data_dir", "source")
KEY_LENGTH = 32  # hex digits of the entry's directory name


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def _data_paths(dataset: dict) -> list[Path]:
    """Existing local paths the dataset config names."""
    named = [s for key in DATA_KEYS for s in _strings(dataset.get(key))]
    named += [s for s in _strings(dataset) if os.path.isabs(s)]
    return sorted({Path(s).resolve() for s in named if s and os.path.exists(s)})


def _files_under(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    found = []
    for directory, subdirs, files in os.walk(path):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))  # ours, and VCS
        found += [Path(directory) / f for f in sorted(files) if not f.startswith(".")]
    return found


class _Manifests:
    """The dataset initializer's manifests above the data files, read once each."""

    def __init__(self) -> None:
        self._by_tree: dict[Path, tuple[dict, float] | None] = {}

    def _tree_of(self, path: Path) -> tuple[Path, dict, float] | None:
        for tree in path.parents:
            if tree not in self._by_tree:
                found = read_manifest(tree)
                completed = _timestamp(found.get("completed_at")) if isinstance(found, dict) \
                    else None
                self._by_tree[tree] = ({e.get("path"): e for e in found.get("files", [])
                                        if isinstance(e, dict)}, completed) \
                    if completed is not None else None
            if self._by_tree[tree] is not None:
                files, completed = self._by_tree[tree]
                return tree, files, completed
        return None

    def digest(self, path: Path, stat: os.stat_result) -> str | None:
        found = self._tree_of(path)
        if found is None:
            return None
        tree, files, completed = found
        entry = files.get(str(path.relative_to(tree)))
        # completed_at has whole seconds; a file written in its second is older still.
        if (entry and entry.get("size") == stat.st_size and entry.get("sha256")
                and stat.st_mtime <= completed + 1):
            return str(entry["sha256"])
        return None


def _timestamp(text: Any) -> float | None:
    try:
        return float(calendar.timegm(time.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def _data_identity(dataset: dict) -> dict[str, str]:
    manifests = _Manifests()
    identity = {}
    for root in _data_paths(dataset):
        for path in _files_under(root):
            stat = path.stat()
            digest = manifests.digest(path, stat)
            identity[str(path)] = (f"sha256:{digest}" if digest
                                   else f"size:{stat.st_size},mtime_ns:{stat.st_mtime_ns}")
    return identity


def _tokenizer_files(tokenizer: dict) -> dict[str, str]:
    return {s: sha256_of(Path(s)) for s in sorted(set(_strings(tokenizer)))
            if s and os.path.isfile(s)}


def _components(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        if isinstance(value.get("_component_"), str):
            yield value["_component_"]
        for item in value.values():
            yield from _components(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _components(item)


def _code(*configs: dict) -> dict[str, str]:
    """The source file of each component torchtune's version does not pin."""
    from torchtune.config._utils import _get_component_from_path

    found = {}
    for component in sorted({c for cfg in configs for c in _components(cfg)}):
        if component.startswith("torchtune."):
            continue
        try:
            module = inspect.getmodule(_get_component_from_path(component))
            source = inspect.getsourcefile(module)
        except Exception:  # the recipe instantiates it and reports a bad path itself
            module, source = None, None
        found[component] = sha256_of(Path(source)) if source else "?"
        # A builder's module names the modules of ours its rows depend on (the preference
        # builder: the module that reads a pair out of a row).
        for name in getattr(module, "TOKENS_DEPEND_ON", ()):
            found[name] = sha256_of(Path(inspect.getsourcefile(importlib.import_module(name))))
    return found


def cache_key(dataset: dict, tokenizer: dict, packing: dict | None,
              ignore_index: int) -> tuple[str, dict]:
    """The entry's key and what it was made of (kept in the entry's record)."""
    inputs = {
        "format": FORMAT_VERSION,
        "versions": {p: _version(p) for p in ("torchtune", "datasets")},
        "dataset": dataset,
        "data_files": _data_identity(dataset),
        "tokenizer": tokenizer,
        "tokenizer_files": _tokenizer_files(tokenizer),
        "code": _code(dataset, tokenizer),
        "packing": packing,
        "ignore_index": ignore_index,
    }
    canonical = json.dumps(inputs, sort_keys=True, default=str)
    # The key covers the values as given; the record, which anyone with the volume reads,
    # keeps them with a URL's user and password masked (a system prompt may quote one).
    return hashlib.sha256(canonical.encode()).hexdigest()[:KEY_LENGTH], masked(inputs)
