"""Write the files of the export, in Hugging Face / PEFT layout, into a staged tree."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from kubetune.exporter import base_model, dora
from kubetune.exporter.training_output import TrainingOutput
from kubetune.errors import BadInputError

log = logging.getLogger("exporter")

FORMATS = ("adapter", "merged", "both")
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
MERGED_INDEX = "model.safetensors.index.json"
# Beside the weights, what a serving stack needs to load the model.
SUPPORT_FILES = ("config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                 "vocab.json", "merges.txt", "original/tokenizer.model")


def default_format(training: TrainingOutput) -> str:
    return "adapter" if training.is_peft else "merged"


def subdirs(fmt: str) -> tuple[str | None, str | None]:
    """Where the adapter and the merged model sit inside the export (None: not exported)."""
    return {"adapter": ("", None), "merged": (None, ""),
            "both": ("adapter", "merged")}[fmt]


def adapter_config(training: TrainingOutput, model_dir: Path) -> dict:
    """torchtune's adapter_config.json, completed so PEFT loads it against the right base."""
    try:
        config = json.loads((training.checkpoint_dir / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise BadInputError(f"{training.checkpoint_dir / ADAPTER_CONFIG} is unreadable ({exc}): "
                            "the checkpoint is incomplete; re-run the trainer") from None
    name, revision = base_model.reference(model_dir)
    # torchtune copies original_repo_id.json verbatim: null when the initializer did not
    # write it, a file:// URI for a PVC source; neither is something PEFT can resolve.
    config["base_model_name_or_path"] = name
    if revision:
        config["revision"] = revision
    config.setdefault("task_type", "CAUSAL_LM")
    config.setdefault("peft_type", "LORA")
    model_cfg = training.config().get("model") or {}
    config.setdefault("lora_dropout", float(model_cfg.get("lora_dropout") or 0.0))
    if model_cfg.get("use_dora"):
        config["use_dora"] = True
    return config


def write_adapter(training: TrainingOutput, model_dir: Path, dest: Path) -> None:
    if not training.is_peft:
        raise BadInputError("EXPORT_FORMAT asks for an adapter, but the run was a full "
                            "fine-tune (no adapter_model.safetensors): use EXPORT_FORMAT=merged")
    dest.mkdir(parents=True, exist_ok=True)
    config = adapter_config(training, model_dir)
    (dest / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    source = training.checkpoint_dir / ADAPTER_WEIGHTS
    from kubetune.trainer.checkpoint_model import architecture_of, read_config

    model_config = read_config(Path(model_dir))
    # Only families whose q/k rows torchtune permutes have magnitudes out of HF order.
    if architecture_of(model_config).permutes_qk and dora.needs_fix(source):
        fixed = dora.write_fixed(source, dest / ADAPTER_WEIGHTS, model_config)
        log.info("adapter: %d DoRA magnitude vectors of q/k put in Hugging Face row order", fixed)
    else:
        shutil.copyfile(source, dest / ADAPTER_WEIGHTS)


def write_merged(training: TrainingOutput, dest: Path) -> None:
    src = training.checkpoint_dir
    shards = training.merged_shards()
    if not shards:
        raise BadInputError(f"{src} holds no merged model shards (the recipe saved adapter "
                            "weights only): use EXPORT_FORMAT=adapter")
    dest.mkdir(parents=True, exist_ok=True)
    for shard in shards:
        shutil.copyfile(shard, dest / shard.name)
    if (src / MERGED_INDEX).is_file():
        shutil.copyfile(src / MERGED_INDEX, dest / MERGED_INDEX)
    for name in SUPPORT_FILES:
        if (src / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / name, dest / name)
    if not (dest / "config.json").is_file():
        raise BadInputError(f"{src} has merged shards but no config.json: the checkpoint is "
                            "incomplete; re-run the trainer")
