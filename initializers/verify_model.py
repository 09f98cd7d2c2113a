"""Is a downloaded model tree usable? Checked without loading a byte of weights (the
headers, shards and config.json sizes in `kubetune.workspace.weight_headers`)."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

from kubetune.errors import BadInputError
from kubetune.workspace import adapter_export
from kubetune.workspace.weight_headers import check_model, read_header


def _json_object(path: Path, what: str) -> dict:
    try:
        found = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadInputError(f"{what} does not parse: {exc}") from None
    if not isinstance(found, dict):
        raise BadInputError(f"{what} is a JSON {type(found).__name__}, not an object")
    return found


def _shards(tree: Path, index: Path) -> set[str]:
    weight_map = _json_object(index, index.name).get("weight_map")
    if not isinstance(weight_map, dict) or not all(
            isinstance(v, str) for v in weight_map.values()):
        raise BadInputError(f"{index.name} is unreadable: its weight_map is not an object of "
                            "tensor name -> shard file name")
    shards = set(weight_map.values())
    for shard in sorted(shards):
        # The trainer opens these names: one pointing outside the model directory is
        # refused here, before anything reads it.
        parts = PurePosixPath(shard).parts
        if not shard or PurePosixPath(shard).is_absolute() or ".." in parts or "\\" in shard:
            raise BadInputError(f"{index.name} names shard {shard!r}, outside the model "
                                "directory: only file names inside it are allowed")
    return shards


def verify(tree: Path) -> list[str]:
    """Raise BadInputError if ``tree`` is not a usable model; return log notes."""
    notes = []
    config_path = tree / "config.json"
    if not config_path.is_file():
        continuing = adapter_export.advice(tree)
        if continuing:
            raise BadInputError(continuing)
        # The trainer reads the architecture from it: without one it cannot build a model.
        raise BadInputError("the model has no config.json: the trainer needs a Hugging Face "
                            "transformers model directory (check STORAGE_URI and "
                            "ALLOW/IGNORE_PATTERNS)")
    config = _json_object(config_path, "config.json")
    index = tree / "model.safetensors.index.json"
    weight_map = None
    if index.is_file():
        shards = _shards(tree, index)
        missing = sorted(s for s in shards if not (tree / s).is_file())
        if missing:
            raise BadInputError(f"shards named in model.safetensors.index.json are missing: "
                                f"{', '.join(missing[:3])} (check ALLOW/IGNORE_PATTERNS)")
        weight_map = _json_object(index, index.name)["weight_map"]
    # What the trainer loads (model_files.weight_files): the shards the index names, else
    # every top-level file. Other safetensors (a subfolder's variant) need only be whole.
    every = sorted(tree.rglob("*.safetensors"))
    loaded = sorted({tree / name for name in weight_map.values()} if weight_map is not None
                    else {p for p in every if p.parent == tree})
    tensors = check_model(tree, config, loaded, weight_map)
    tensors += sum(len(read_header(p)) for p in every if p not in loaded)
    if tensors:
        notes.append(f"verified {tensors} tensors in safetensors headers")
    return notes
