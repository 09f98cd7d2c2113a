"""A config's checkpointer sections fitted to checkpoints on disk: the policy's
``checkpointer``, a reference copy's (DPO's ``ref_checkpointer``) and a teacher's
(fitted by its objective), each reading its checkpoint's files in its model's format."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from kubetune.model_family.architecture import HF_CHECKPOINTER
from kubetune.trainer.checkpointing.checkpoint_model import CheckpointModel, read_checkpoint_model


def checkpointer_sections(cfg: DictConfig, checkpoint: CheckpointModel, user_keys: set[str],
                          fitted_elsewhere: tuple[str, ...] = ()) -> None:
    """Every checkpointer the config has (the policy's ``checkpointer``; DPO's
    ``ref_checkpointer``...) fitted to its checkpoint on disk: the one given, unless the
    user named another directory for that section. ``fitted_elsewhere``: the sections
    the run's objective fits to another model (a teacher)."""
    checkpointer_section(cfg, "checkpointer", checkpoint)
    for name in [k for k in cfg.keys() if str(k).endswith("_checkpointer")]:
        if not isinstance(cfg.get(name), DictConfig) or name in fitted_elsewhere:
            continue
        named = f"{name}.checkpoint_dir" in user_keys
        other = read_checkpoint_model(Path(cfg[name].checkpoint_dir)) if named else checkpoint
        checkpointer_section(cfg, str(name), other)


def checkpointer_section(cfg: DictConfig, name: str, checkpoint: CheckpointModel) -> None:
    """Section ``name`` reading ``checkpoint``'s files, writing into the run's output."""
    ckpt_cfg = cfg.get(name) or OmegaConf.create({})
    ckpt_cfg._component_ = ckpt_cfg.get("_component_",
                                        "torchtune.training.FullModelHFCheckpointer")
    if checkpoint.architecture.checkpointer != HF_CHECKPOINTER:  # a family of ours
        ckpt_cfg._component_ = checkpoint.architecture.checkpointer
    ckpt_cfg.checkpoint_dir = str(checkpoint.model_dir)
    ckpt_cfg.checkpoint_files = checkpoint.weight_files
    ckpt_cfg.model_type = checkpoint.architecture.model_type
    ckpt_cfg.output_dir = "${output_dir}"
    ckpt_cfg.recipe_checkpoint = None
    cfg[name] = ckpt_cfg
