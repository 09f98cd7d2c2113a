"""The model directory as the model initializer leaves it and every later step reads it:
``config.json`` (the architecture) and the safetensors weights (one file, or shards an
index names)."""

from __future__ import annotations

import json
from pathlib import Path

from kubetune.errors import BadInputError
from kubetune.workspace import MODEL_CONFIG_NAME, WEIGHTS_INDEX_NAME


def read_config(model_dir: Path) -> dict:
    """The model's ``config.json``; a missing directory or file is a one-line error."""
    model_dir = Path(model_dir)
    path = model_dir / MODEL_CONFIG_NAME
    if not model_dir.is_dir():
        raise BadInputError(f"model directory {model_dir} does not exist: run the model "
                            "initializer first or set --model-dir / KUBETUNE_MODEL_DIR")
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise BadInputError(f"{path} is missing: {model_dir} is not a Hugging Face model "
                            "directory") from None
    except (OSError, ValueError) as exc:
        raise BadInputError(f"{path} is unreadable: {exc}") from None


def weight_files(model_dir: Path) -> list[str]:
    """The names of the model's safetensors files: the shards its index names, or every
    ``*.safetensors`` when it has no index."""
    model_dir = Path(model_dir)
    index = model_dir / WEIGHTS_INDEX_NAME
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError) as exc:
            raise BadInputError(f"{index} is unreadable: {exc}") from None
        missing = [n for n in names if not (model_dir / n).is_file()]
        if missing:
            raise BadInputError(f"{model_dir}: shards named in the index are missing: "
                                f"{', '.join(missing[:3])}")
        return names
    single = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if not single:
        raise BadInputError(f"{model_dir} has no *.safetensors weights")
    return single
