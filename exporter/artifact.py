"""Write the files of the export, in Hugging Face / PEFT layout, into a staged tree."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from kubetune.exporter import adapter_merge, dora, tokenizer_files
from kubetune.exporter.chat_format import ChatFormat
from kubetune.exporter.training_output import TrainingOutput
from kubetune.errors import BadInputError
from kubetune.model_family.architecture import architecture_of
from kubetune.workspace import (ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, MODEL_CONFIG_NAME,
                                WEIGHTS_INDEX_NAME)
from kubetune.workspace.model_files import read_config
from kubetune.workspace.weight_headers import read_header

log = logging.getLogger("exporter")

FORMATS = ("adapter", "merged", "both")


def default_format(training: TrainingOutput) -> str:
    return "adapter" if training.is_peft else "merged"


def subdirs(fmt: str) -> tuple[str | None, str | None]:
    """Where the adapter and the merged model sit inside the export (None: not exported)."""
    return {"adapter": ("", None), "merged": (None, ""),
            "both": ("adapter", "merged")}[fmt]


def adapter_config(training: TrainingOutput, base: dict) -> dict:
    """torchtune's adapter_config.json, completed so PEFT loads it against the right base
    (``base``: its name and revision, as ``base_model.source`` gives them)."""
    path = training.checkpoint_dir / ADAPTER_CONFIG_NAME
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BadInputError(f"{path} is unreadable ({exc}): the checkpoint is incomplete; "
                            "re-run the trainer") from None
    name, revision = base["name"], base.get("revision")
    # torchtune copies original_repo_id.json verbatim: null when the initializer did not
    # write it, a file:// URI for a PVC source; neither is something PEFT can resolve.
    config["base_model_name_or_path"] = name
    if revision:
        config["revision"] = revision
    config.setdefault("task_type", "CAUSAL_LM")
    config.setdefault("peft_type", "LORA")
    model_cfg = training.config().get("model") or {}
    config.setdefault("lora_dropout", float(model_cfg.get("lora_dropout") or 0.0))
    if training.method == "dora":
        config["use_dora"] = True
    return config


def write_adapter(training: TrainingOutput, model_dir: Path, base: dict, dest: Path,
                  chat: ChatFormat) -> None:
    """The PEFT adapter, with the tokenizer files and generation config (``chat``)."""
    if not training.is_peft:
        raise BadInputError("EXPORT_FORMAT asks for an adapter, but the run was a full "
                            "fine-tune (no adapter_model.safetensors): use EXPORT_FORMAT=merged")
    dest.mkdir(parents=True, exist_ok=True)
    config = adapter_config(training, base)
    (dest / ADAPTER_CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    source = training.checkpoint_dir / ADAPTER_WEIGHTS_NAME
    try:
        # Copied as bytes otherwise: a truncated adapter would be exported, and fail where
        # it is served.
        read_header(source)
    except BadInputError as exc:
        raise BadInputError(f"the trained adapter {source} is damaged ({exc.message}): "
                            "train again (or restore the output volume)") from None
    model_config = read_config(Path(model_dir))
    # Only families whose q/k rows torchtune permutes have magnitudes out of HF order.
    if architecture_of(model_config).permutes_qk and dora.needs_fix(source):
        fixed = dora.write_fixed(source, dest / ADAPTER_WEIGHTS_NAME, model_config)
        log.info("adapter: %d DoRA magnitude vectors of q/k put in Hugging Face row order", fixed)
    else:
        shutil.copyfile(source, dest / ADAPTER_WEIGHTS_NAME)
    tokenizer_files.write(model_dir, dest, chat)


def write_merged(training: TrainingOutput, model_dir: Path, dest: Path,
                 chat: ChatFormat) -> None:
    """The merged weights and their config.json as the trainer saved them (a LoRA
    checkpoint saved without them: merged here from the base and the adapter); the
    tokenizer files and generation config as beside the adapter (``chat``)."""
    src = training.checkpoint_dir
    shards = training.merged_shards()
    if not shards and training.method == "lora" and (src / ADAPTER_WEIGHTS_NAME).is_file():
        shards = adapter_merge.write(src, model_dir, dest, training.config().get("dtype"))
    elif not shards:
        raise BadInputError(f"{src} holds no merged model shards (the recipe saved adapter "
                            "weights only): use EXPORT_FORMAT=adapter")
    else:
        dest.mkdir(parents=True, exist_ok=True)
        for shard in shards:
            shutil.copyfile(shard, dest / shard.name)
        for name in (WEIGHTS_INDEX_NAME, MODEL_CONFIG_NAME):
            if (src / name).is_file():
                shutil.copyfile(src / name, dest / name)
    tokenizer_files.write(model_dir, dest, chat)
    if not (dest / MODEL_CONFIG_NAME).is_file():
        raise BadInputError(f"{src} has merged shards but no config.json: the checkpoint is "
                            "incomplete; re-run the trainer")
    match_torch_dtype(dest / MODEL_CONFIG_NAME, [dest / shard.name for shard in shards])


# safetensors dtype -> config.json's torch_dtype spelling.
_TORCH_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}


def match_torch_dtype(config_path: Path, shards: list[Path]) -> None:
    """config.json's ``torch_dtype`` set to the weights' own: torchtune copies the base
    model's config, so a run that trained in bf16 from an fp32 base would say float32, and
    transformers (``torch_dtype="auto"``) would load the bf16 weights as fp32."""
    counts: dict[str, int] = {}
    for shard in shards:
        for dtype, shape in read_header(shard).values():
            if dtype in _TORCH_DTYPES:
                size = 1
                for dim in shape:
                    size *= dim
                counts[dtype] = counts.get(dtype, 0) + size
    if not counts:
        return
    wanted = _TORCH_DTYPES[max(counts, key=counts.__getitem__)]
    config = json.loads(config_path.read_text())
    keys = [k for k in ("torch_dtype", "dtype") if k in config] or ["torch_dtype"]
    if all(config.get(k) == wanted for k in keys):
        return
    log.info("merged: config.json torch_dtype %s -> %s, the weights' own",
             config.get(keys[0]), wanted)
    config.update({k: wanted for k in keys})
    config_path.write_text(json.dumps(config, indent=2) + "\n")
