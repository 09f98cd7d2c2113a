"""A model source that is an adapter export (ours or any PEFT adapter): what training
needs to go on from it, said in one line.

Training continues from a whole model: the adapter alone has no config.json or base
weights, and torchtune's LoRA recipes load an adapter only to resume their own run
(with its optimizer state). So the line names the base the adapter was trained on (the
export's manifest, else its adapter_config.json) and how to continue: export the run
merged and train from that."""

from __future__ import annotations

import json
from pathlib import Path

from kubetune.workspace import ADAPTER_CONFIG_NAME, EXPORT_MANIFEST_NAME, MODEL_CONFIG_NAME

HOW = ("training goes on from a whole model: run it again with EXPORT_FORMAT=merged and "
       "an --export-uri (the same arguments train nothing again: `EXPORT_FORMAT=merged "
       "kubetune local ... --export-uri ./merged`), then give that export as the model "
       "(--model file://./merged, or the model initializer's storageUri)")


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def base_of(tree: Path) -> str | None:
    """The base model an adapter export was trained on, as its own record names it."""
    base = _json(tree / EXPORT_MANIFEST_NAME).get("base_model")
    if isinstance(base, dict) and (base.get("source") or base.get("name")):
        return str(base.get("source") or base.get("name"))
    name = _json(tree / ADAPTER_CONFIG_NAME).get("base_model_name_or_path")
    return str(name) if name else None


def advice(tree: Path) -> str | None:
    """One line for a model directory that is an adapter export, or None when it is not."""
    tree = Path(tree)
    if (tree / MODEL_CONFIG_NAME).is_file():
        return None
    if (tree / "merged" / MODEL_CONFIG_NAME).is_file():  # EXPORT_FORMAT=both
        return (f"this is an export with adapter/ and merged/: give its merged model "
                f"({tree / 'merged'}) to continue training")
    if not (tree / ADAPTER_CONFIG_NAME).is_file():
        return None
    base = base_of(tree)
    on = f" trained on {base}" if base else ""
    return f"this is an adapter export (a LoRA adapter{on}), not a model: {HOW}"
