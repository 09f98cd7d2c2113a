"""Structural checks of an export: its tensors fit the base model they claim to extend."""

from __future__ import annotations

import re
from pathlib import Path

from kubetune.errors import BadInputError

_ADAPTER_KEY = re.compile(
    r"^base_model\.model\.(?P<module>.+)\.(?:lora_(?P<ab>[AB])\.weight|"
    r"(?P<mag>lora_magnitude_vector)(?:\.weight)?)$")


def shapes(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape, from the safetensors header alone (no weights are read)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as exc:  # safetensors raises its own error types for a bad header
        raise BadInputError(f"{path.name} is not a readable safetensors file: {exc}") from None


def shapes_of(files: list[Path]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for path in files:
        found.update(shapes(path))
    return found


def check_adapter(adapter_file: Path, base: dict[str, list[int]]) -> int:
    """Every LoRA pair sits on a base weight of matching shape. Returns the pair count."""
    pairs: dict[str, dict[str, list[int]]] = {}
    for key, shape in shapes(adapter_file).items():
        match = _ADAPTER_KEY.match(key)
        if not match:
            raise BadInputError(f"adapter tensor {key!r} is not in PEFT layout "
                                "(base_model.model.<module>.lora_A/B.weight)")
        pairs.setdefault(match["module"], {})["M" if match["mag"] else match["ab"]] = shape
    if not pairs:
        raise BadInputError(f"{adapter_file.name} holds no LoRA tensors")
    for module, found in pairs.items():
        weight = base.get(f"{module}.weight")
        if weight is None:
            raise BadInputError(f"adapter targets {module}, which the base model does not have")
        if not {"A", "B"} <= set(found):
            raise BadInputError(f"adapter for {module} lacks lora_{'B' if 'A' in found else 'A'}")
        (rank_a, in_a), (out_b, rank_b) = found["A"], found["B"]
        if rank_a != rank_b or [out_b, in_a] != weight:
            raise BadInputError(f"adapter for {module} has shapes A{found['A']} B{found['B']} "
                                f"that do not fit the base weight {weight}")
        if "M" in found and found["M"] != [out_b]:
            raise BadInputError(f"adapter for {module} has a DoRA magnitude of shape "
                                f"{found['M']}, not [{out_b}]")
    return len(pairs)


def check_merged(shard_files: list[Path], base: dict[str, list[int]]) -> int:
    """The merged model has exactly the base model's tensors and shapes. Returns the count."""
    merged = shapes_of(shard_files)
    missing = sorted(set(base) - set(merged))
    extra = sorted(set(merged) - set(base))
    if missing or extra:
        what = f"lacks {missing[0]}" if missing else f"has {extra[0]}, which the base lacks"
        raise BadInputError(f"the merged model {what}: it is not a fine-tune of this base model")
    for key, shape in merged.items():
        if base[key] != shape:
            raise BadInputError(f"merged tensor {key} has shape {shape}, the base {base[key]}")
    return len(merged)
