"""The model directory as the model initializer leaves it and every later step reads it:
``config.json`` (the architecture) and the safetensors weights (one file, or shards an
index names)."""

from __future__ import annotations

import json
from pathlib import Path

from kubetune.errors import BadInputError
from kubetune.workspace import MODEL_CONFIG_NAME, REPO_ID_NAME, WEIGHTS_INDEX_NAME


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


def indexed_shards(model_dir: Path, fix: str = "") -> list[str] | None:
    """The shard names ``model.safetensors.index.json`` maps tensors to, each checked to be
    there; None where there is no index. ``fix`` ends the error line (what to do)."""
    index = Path(model_dir) / WEIGHTS_INDEX_NAME
    if not index.is_file():
        return None
    try:
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as exc:
        raise BadInputError(f"{index} is unreadable ({exc}){fix}") from None
    missing = [n for n in names if not (Path(model_dir) / n).is_file()]
    if missing:
        raise BadInputError(f"{model_dir} lacks shards its index names "
                            f"({', '.join(missing[:3])}){fix}")
    return names


def weight_files(model_dir: Path) -> list[str]:
    """The names of the model's safetensors files: the shards its index names, or every
    ``*.safetensors`` when it has no index."""
    model_dir = Path(model_dir)
    names = indexed_shards(model_dir)
    if names is not None:
        return names
    single = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if not single:
        raise BadInputError(f"{model_dir} has no *.safetensors weights")
    return single


def original_repo_id(model_dir: Path) -> str | None:
    """The repo id the model initializer recorded for the model (the file torchtune's HF
    checkpointer reads for ``adapter_config.json``), or None where none was recorded or
    the record is unreadable: callers fall back to what else names the base model."""
    try:
        repo_id = json.loads((Path(model_dir) / REPO_ID_NAME).read_text()).get("repo_id")
    except (OSError, ValueError, AttributeError):
        return None
    return repo_id if isinstance(repo_id, str) and repo_id else None
