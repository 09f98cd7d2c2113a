"""Is a downloaded model tree usable? Checked without loading a byte of weights."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from kubetune.errors import BadInputError


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
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    end = max((v["data_offsets"][1] for v in tensors.values()), default=0)
    if 8 + header_len + end != size:
        raise BadInputError(f"{path.name} is truncated or padded: the header declares "
                            f"{8 + header_len + end} bytes, the file has {size}")
    return len(tensors)


def verify(tree: Path) -> list[str]:
    """Raise BadInputError if ``tree`` is not a usable model; return log notes."""
    notes = []
    config = tree / "config.json"
    if config.is_file():
        try:
            json.loads(config.read_text())
        except ValueError as exc:
            raise BadInputError(f"config.json does not parse: {exc}") from None
    else:
        notes.append("no config.json: not a Hugging Face transformers model directory")
    index = tree / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (ValueError, KeyError) as exc:
            raise BadInputError(f"model.safetensors.index.json is unreadable: {exc}") from None
        missing = sorted(s for s in shards if not (tree / s).is_file())
        if missing:
            raise BadInputError(f"shards named in model.safetensors.index.json are missing: "
                                f"{', '.join(missing[:3])} (check ALLOW/IGNORE_PATTERNS)")
    tensors = sum(check_safetensors(p) for p in sorted(tree.rglob("*.safetensors")))
    if tensors:
        notes.append(f"verified {tensors} tensors in safetensors headers")
    return notes
