"""Choose and prepare the files of the export, in Hugging Face / PEFT layout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from exporter.training_output import TrainingOutput
from kubetune.errors import BadInputError

FORMATS = ("adapter", "merged", "both")
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")
# Beside the weights, what a serving stack needs to load the model.
SUPPORT_FILES = ("config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                 "vocab.json", "merges.txt", "original/tokenizer.model")


def default_format(training: TrainingOutput) -> str:
    return "adapter" if training.is_peft else "merged"


def base_model_reference(model_dir: Path) -> tuple[str | None, str | None]:
    """(name or path, revision) of the base model, from the model initializer's records."""
    from initializers import manifest as init_manifest
    from kubetune.workspace import REPO_ID_NAME

    found = init_manifest.read(model_dir) or {}
    revision = found.get("resolved_revision")
    try:
        repo_id = json.loads((model_dir / REPO_ID_NAME).read_text()).get("repo_id")
    except (OSError, ValueError):
        repo_id = None
    name = repo_id or found.get("storage_uri")
    if name and name.startswith("file://"):
        name = name[len("file://"):]
    return name, revision


def write_adapter(training: TrainingOutput, model_dir: Path, dest: Path) -> None:
    if not training.is_peft:
        raise BadInputError("EXPORT_FORMAT asks for an adapter, but the run was a full "
                            "fine-tune (no adapter_model.safetensors): use EXPORT_FORMAT=merged")
    src = training.checkpoint_dir
    config = json.loads((src / "adapter_config.json").read_text())
    name, revision = base_model_reference(model_dir)
    if not config.get("base_model_name_or_path"):
        config["base_model_name_or_path"] = name or str(model_dir)
    if revision:
        config["revision"] = revision
    config.setdefault("task_type", "CAUSAL_LM")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "adapter_config.json").write_text(json.dumps(config, indent=2))
    shutil.copyfile(src / "adapter_model.safetensors", dest / "adapter_model.safetensors")


def write_merged(training: TrainingOutput, dest: Path) -> None:
    src = training.checkpoint_dir
    shards = sorted(p.name for p in src.glob("model-*.safetensors"))
    if not shards:
        raise BadInputError(f"{src} holds no merged model shards (the recipe saved adapter "
                            "weights only): use EXPORT_FORMAT=adapter")
    dest.mkdir(parents=True, exist_ok=True)
    for name in shards + ["model.safetensors.index.json"]:
        if (src / name).is_file():
            shutil.copyfile(src / name, dest / name)
    for name in SUPPORT_FILES:
        if (src / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / name, dest / name)
