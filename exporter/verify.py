"""Structural checks of an export before it is declared a success."""

from __future__ import annotations

import re
from pathlib import Path

from kubetune.errors import BadInputError

_ADAPTER_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<ab>[AB])\.weight$")


def _shapes(path: Path) -> dict[str, list[int]]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}


def base_shapes(model_dir: Path) -> dict[str, list[int]]:
    shapes: dict[str, list[int]] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        shapes.update(_shapes(path))
    return shapes


def check_adapter(adapter_file: Path, model_dir: Path) -> int:
    """Every LoRA pair must sit on a base weight of matching shape. Returns pair count."""
    base = base_shapes(model_dir)
    adapter = _shapes(adapter_file)
    pairs: dict[str, dict[str, list[int]]] = {}
    for key, shape in adapter.items():
        match = _ADAPTER_KEY.match(key)
        if not match:
            if key.endswith("lora_magnitude_vector") or "magnitude" in key:
                continue  # DoRA magnitudes
            raise BadInputError(f"adapter tensor {key!r} is not in PEFT layout")
        pairs.setdefault(match["module"], {})[match["ab"]] = shape
    for module, ab in pairs.items():
        weight = base.get(f"{module}.weight")
        if weight is None:
            raise BadInputError(f"adapter targets {module}, which the base model does not have")
        if set(ab) != {"A", "B"}:
            raise BadInputError(f"adapter for {module} lacks lora_{'B' if 'A' in ab else 'A'}")
        (rank_a, in_a), (out_b, rank_b) = ab["A"], ab["B"]
        if rank_a != rank_b or [out_b, in_a] != weight:
            raise BadInputError(f"adapter for {module} has shapes A{ab['A']} B{ab['B']} that do "
                                f"not fit the base weight {weight}")
    return len(pairs)
