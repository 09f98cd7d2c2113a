"""A merged model made by the exporter from the base and a LoRA adapter, for a checkpoint
the trainer saved without one (a LoRA run's saves before its last:
`kubetune.trainer.checkpointing.epoch_saves`), and PEFT's merge rule that the logits
check applies too.

PEFT's rule, W + alpha/r * B @ A (alpha/sqrt(r) with rsLoRA), in Hugging Face key space,
shard by shard of the base (one shard's tensors in memory at a time), in the dtype the run
trained in: what torchtune's merge at the last save writes. The base's shard names, index
and config.json stand beside them.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path
from typing import Iterator

from kubetune.errors import BadInputError
from kubetune.workspace import (ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, MODEL_CONFIG_NAME,
                                WEIGHTS_INDEX_NAME)
from kubetune.workspace.model_files import weight_files

log = logging.getLogger("exporter")

PREFIX = "base_model.model."  # PEFT's keys: the base model's, under this prefix
# The trainer's dtype setting -> torch's name for it.
_DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}


def scaling(config: dict) -> float:
    """The factor on B @ A, as PEFT computes it from adapter_config.json."""
    rank = int(config["r"])
    alpha = float(config.get("lora_alpha", rank))
    return alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank


def adapted_modules(adapter: dict) -> Iterator[tuple]:
    """(module, lora_A, lora_B) for each adapted module, in the base's key space."""
    for key, a in adapter.items():
        if key.endswith(".lora_A.weight"):
            module = key[len(PREFIX):-len(".lora_A.weight")]
            yield module, a, adapter[f"{PREFIX}{module}.lora_B.weight"]


def write(checkpoint_dir: Path, model_dir: Path, dest: Path, trained_dtype: str | None
          ) -> list[Path]:
    """The merged model of ``checkpoint_dir``'s adapter over ``model_dir``'s base, written
    into ``dest``; returns its shards. ``trained_dtype``: the run's ``dtype`` setting (the
    base's own dtype where None)."""
    import torch
    from safetensors.torch import load_file, save_file

    try:
        config = json.loads((checkpoint_dir / ADAPTER_CONFIG_NAME).read_text())
        adapter = load_file(str(checkpoint_dir / ADAPTER_WEIGHTS_NAME))
    except Exception as exc:  # safetensors raises its own error types for a bad file
        raise BadInputError(f"the adapter in {checkpoint_dir} is unreadable ({exc}): the "
                            "checkpoint is incomplete; re-run the trainer") from None
    factor = scaling(config)
    pending = {f"{module}.weight": (a, b) for module, a, b in adapted_modules(adapter)}
    dtype = getattr(torch, _DTYPES[trained_dtype]) if trained_dtype in _DTYPES else None
    dest.mkdir(parents=True, exist_ok=True)
    shards = []
    for name in weight_files(model_dir):
        shard = load_file(str(Path(model_dir) / name))
        for key, weight in shard.items():
            if key in pending:
                a, b = pending.pop(key)
                weight = weight.float() + factor * (b.float() @ a.float())
            shard[key] = weight.to(dtype or shard[key].dtype).contiguous()
        save_file(shard, str(dest / name), metadata={"format": "pt"})
        shards.append(dest / name)
    if pending:
        raise BadInputError(f"the adapter in {checkpoint_dir} adapts {sorted(pending)[0]}, "
                            "which the base model does not have: it is not this model's "
                            "adapter")
    for name in (WEIGHTS_INDEX_NAME, MODEL_CONFIG_NAME):
        if (Path(model_dir) / name).is_file():
            shutil.copyfile(Path(model_dir) / name, dest / name)
    log.info("merged: base + adapter of %s (the checkpoint holds no merged model)",
             checkpoint_dir.name)
    return shards
