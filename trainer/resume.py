"""Resumable checkpoints: the record that says one exists, and resuming from it.

torchtune saves the weights (``epoch_N/``) and the recipe state (``recipe_state/``:
optimizer, epoch, data loader position) but nothing that says *which run* they belong
to. After each resumable save the trainer writes ``kubetune-resume.json`` beside them
with a fingerprint of the merged config; a restart resumes only when the fingerprint
matches, so a changed job never continues a different one's weights.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

RESUME_RECORD_NAME = "kubetune-resume.json"
# Settings that do not change what is trained, so a restart with them changed resumes.
_VOLATILE_KEYS = ("kubetune", "resume_from_checkpoint", "metric_logger", "log_every_n_steps",
                  "profiler", "output_dir")
_VOLATILE_CHECKPOINTER_KEYS = ("adapter_checkpoint", "recipe_checkpoint",
                               "resume_from_checkpoint", "should_load_recipe_state",
                               "checkpoint_files", "output_dir")


@dataclass
class ResumeRecord:
    fingerprint: str
    epochs_run: int  # epochs finished (torchtune's EPOCHS_KEY)
    steps_in_epoch: int  # optimizer steps done in the unfinished epoch
    global_step: int
    epoch_dir: str  # epoch_N/ that holds the weights or adapter
    adapter: bool  # LoRA-style: the base stays in the model dir, the adapter is in epoch_dir
    reason: str  # "epoch", "step" (periodic save) or "signal"


def fingerprint(cfg: DictConfig) -> str:
    data = OmegaConf.to_container(cfg, resolve=False)
    for key in _VOLATILE_KEYS:
        data.pop(key, None)
    for key in _VOLATILE_CHECKPOINTER_KEYS:
        (data.get("checkpointer") or {}).pop(key, None)
    canonical = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def write_record(output_dir: Path, record: ResumeRecord) -> None:
    tmp = Path(output_dir) / (RESUME_RECORD_NAME + ".tmp")
    tmp.write_text(json.dumps(asdict(record), indent=2))
    os.replace(tmp, Path(output_dir) / RESUME_RECORD_NAME)


def read_record(output_dir: Path) -> ResumeRecord | None:
    path = Path(output_dir) / RESUME_RECORD_NAME
    try:
        return ResumeRecord(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def clear(output_dir: Path) -> None:
    (Path(output_dir) / RESUME_RECORD_NAME).unlink(missing_ok=True)


def apply(cfg: DictConfig, output_dir: Path) -> ResumeRecord | None:
    """Point ``cfg`` at the resumable checkpoint in ``output_dir`` if it is this run's.

    Returns the record resumed from, or None (nothing to resume, or another run's).
    """
    record = read_record(output_dir)
    if record is None or record.fingerprint != fingerprint(cfg):
        return None
    epoch_dir = Path(output_dir) / record.epoch_dir
    state = Path(output_dir) / "recipe_state" / "recipe_state.pt"
    if not epoch_dir.is_dir() or not state.is_file():
        return None
    cfg.resume_from_checkpoint = True
    if record.adapter:
        if not (epoch_dir / "adapter_model.pt").is_file():
            return None
        cfg.checkpointer.adapter_checkpoint = f"{record.epoch_dir}/adapter_model.pt"
    else:
        # Full fine-tuning resumes from the saved weights themselves, read from output_dir.
        shards = sorted(p.name for p in epoch_dir.glob("*.safetensors")
                        if not p.name.startswith("adapter"))
        if not shards:
            return None
        cfg.checkpointer.checkpoint_files = [f"{record.epoch_dir}/{s}" for s in shards]
    cfg.checkpointer.recipe_checkpoint = "recipe_state/recipe_state.pt"
    return record
