"""Is a downloaded model tree usable? Checked without loading a byte of weights."""

from __future__ import annotations

import json
import struct
from pathlib import Path, PurePosixPath

from kubetune.errors import BadInputError


def _data_end(path: Path, name: str, entry: object) -> int:
    offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0
                       for o in offsets) or offsets[0] > offsets[1]):
        raise BadInputError(f"{path.name} has a corrupt safetensors header: tensor {name!r} "
                            "has no valid data_offsets [begin, end]")
    return offsets[1]


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


def check_safetensors(path: Path) -> int:
    """Read the header; the file must hold exactly the bytes it declares. Returns tensor count."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise BadInputError(f"{path.name} is not a safetensors file (shorter than its header)")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > min(size - 8, 100 * 1024 * 1024):
            raise BadInputError(f"{path.name} has a corrupt safetensors header")
        try:
            header = json.loads(f.read(header_len))
        except ValueError:
            raise BadInputError(f"{path.name} has a corrupt safetensors header") from None
    if not isinstance(header, dict):
        raise BadInputError(f"{path.name} has a corrupt safetensors header (a JSON "
                            f"{type(header).__name__}, not an object of tensors)")
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    end = max((_data_end(path, name, entry) for name, entry in tensors.items()), default=0)
    if 8 + header_len + end != size:
        raise BadInputError(f"{path.name} is truncated or padded: the header declares "
                            f"{8 + header_len + end} bytes, the file has {size}")
    return len(tensors)


def verify(tree: Path) -> list[str]:
    """Raise BadInputError if ``tree`` is not a usable model; return log notes."""
    notes = []
    config = tree / "config.json"
    if config.is_file():
        _json_object(config, "config.json")
    else:
        notes.append("no config.json: not a Hugging Face transformers model directory")
    index = tree / "model.safetensors.index.json"
    if index.is_file():
        shards = _shards(tree, index)
        missing = sorted(s for s in shards if not (tree / s).is_file())
        if missing:
            raise BadInputError(f"shards named in model.safetensors.index.json are missing: "
                                f"{', '.join(missing[:3])} (check ALLOW/IGNORE_PATTERNS)")
    tensors = sum(check_safetensors(p) for p in sorted(tree.rglob("*.safetensors")))
    if tensors:
        notes.append(f"verified {tensors} tensors in safetensors headers")
    return notes
