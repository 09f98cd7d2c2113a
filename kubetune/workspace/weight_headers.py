"""A model directory's safetensors headers, read without a byte of weights: each file
holds exactly the bytes its header declares, in dtypes a loader reads; the files the
trainer loads are one model's shards; config.json's sizes match them.

The model initializer runs it on what it downloaded; the trainer on the directory it is
given (a model no initializer checked, `kubetune train --model-dir`): a truncated file or
a config.json of another model is one line, not a traceback from inside the recipe.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from kubetune.errors import BadInputError

def _data_end(path: Path, name: str, entry: object) -> int:
    offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0
                       for o in offsets) or offsets[0] > offsets[1]):
        raise BadInputError(f"{path.name} has a corrupt safetensors header: tensor {name!r} "
                            "has no valid data_offsets [begin, end]")
    return offsets[1]


# safetensors' dtypes and their sizes in bits; a name not here is one no loader reads.
DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
              "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
              "I64": 64, "U64": 64, "F64": 64, "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}
FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}
# Tensors of a decoder model in HF layout whose shapes config.json fixes.
EMBEDDINGS = ("model.embed_tokens.weight", "transformer.wte.weight")
_LAYER = re.compile(r"^(?:model\.layers|transformer\.h)\.(\d+)\.")


def _tensor(path: Path, name: str, entry: object) -> tuple[str, tuple[int, ...]]:
    """(dtype, shape) of one header entry, its byte range matching both."""
    end = _data_end(path, name, entry)
    dtype, shape = entry.get("dtype"), entry.get("shape")
    if dtype not in DTYPE_BITS:
        raise BadInputError(f"{path.name}: tensor {name!r} has dtype {dtype!r}, which no "
                            f"safetensors loader reads (known: {', '.join(DTYPE_BITS)})")
    if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise BadInputError(f"{path.name} has a corrupt safetensors header: tensor {name!r} "
                            "has no valid shape")
    count = 1
    for dim in shape:
        count *= dim
    if count * DTYPE_BITS[dtype] != (end - entry["data_offsets"][0]) * 8:
        raise BadInputError(f"{path.name} has a corrupt safetensors header: tensor {name!r} "
                            f"({dtype} {shape}) does not fill its data_offsets")
    return dtype, tuple(shape)


def read_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Read the header; the file must hold exactly the bytes it declares. Returns each
    tensor's (dtype, shape)."""
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
    entries = {k: v for k, v in header.items() if k != "__metadata__"}
    end = max((_data_end(path, name, entry) for name, entry in entries.items()), default=0)
    if 8 + header_len + end != size:
        raise BadInputError(f"{path.name} is truncated or padded: the header declares "
                            f"{8 + header_len + end} bytes, the file has {size}")
    return {name: _tensor(path, name, entry) for name, entry in entries.items()}


def check_shards(headers: dict[Path, dict], tree: Path, weight_map: dict | None) -> None:
    """The files of one model agree: no tensor twice, the index says where each is, and
    their float dtypes overlap (disjoint ones are two exports mixed in one folder)."""
    seen: dict[str, Path] = {}
    for path, tensors in headers.items():
        for name in tensors:
            if name in seen:
                raise BadInputError(f"tensor {name!r} is in both {seen[name].relative_to(tree)} "
                                    f"and {path.relative_to(tree)}: the files are not one "
                                    "model's shards (check ALLOW/IGNORE_PATTERNS)")
            seen[name] = path
    if weight_map is not None:
        for name, shard in weight_map.items():
            where = seen.get(name)
            if where is None or where != tree / shard:
                raise BadInputError(f"model.safetensors.index.json places tensor {name!r} in "
                                    f"{shard}, which does not hold it: the index and the shards "
                                    "are from different exports")
    floats = {path: {d for d, _ in tensors.values() if d in FLOAT_DTYPES}
              for path, tensors in headers.items()}
    kinds = [f for f in floats.values() if f]
    if kinds and not set.intersection(*kinds):
        listed = ", ".join(f"{p.relative_to(tree)}: {'/'.join(sorted(f))}"
                           for p, f in floats.items() if f)
        raise BadInputError(f"the weight files disagree on dtype ({listed}): they are not one "
                            "model's shards")


def check_config(config: dict, headers: dict[Path, dict]) -> None:
    """config.json's sizes against the weights: torchtune builds the model from the one
    and loads the other, and a mismatch is a size error deep in load_state_dict."""
    tensors = {name: shape for found in headers.values() for name, (_, shape) in found.items()}
    hidden, vocab = config.get("hidden_size"), config.get("vocab_size")
    embedding = next((tensors[n] for n in EMBEDDINGS if n in tensors), None)
    if embedding is not None and len(embedding) == 2 and isinstance(hidden, int) \
            and isinstance(vocab, int) and embedding != (vocab, hidden):
        raise BadInputError(f"config.json says vocab_size={vocab}, hidden_size={hidden}, but "
                            f"the embedding weights are {list(embedding)}: config.json is not "
                            "this model's")
    layers = config.get("num_hidden_layers")
    indices = {int(m.group(1)) for n in tensors if (m := _LAYER.match(n))}
    if indices and isinstance(layers, int) and max(indices) + 1 != layers:
        raise BadInputError(f"config.json says num_hidden_layers={layers}, but the weights "
                            f"hold {max(indices) + 1} layers: config.json is not this model's")


def check_model(tree: Path, config: dict, loaded: list[Path],
                weight_map: dict | None = None) -> int:
    """Check ``loaded`` (the files the trainer reads) and config.json's sizes against
    them. Returns the tensor count."""
    headers = {path: read_header(path) for path in loaded}
    check_shards(headers, tree, weight_map)
    check_config(config, headers)
    return sum(len(found) for found in headers.values())
