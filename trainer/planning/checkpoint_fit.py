"""The sections a checkpoint decides, rebuilt for the one on disk: the model (its family's
builder and shape, the method's LoRA settings kept), the scheduler a warm-up needs, the
checkpointers and the tokenizer; with the request's keys and values checked against
what will be built."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from kubetune.errors import BadInputError
from kubetune.trainer.checkpointing.checkpoint_model import CheckpointModel
from kubetune.trainer.checkpointing.checkpointer_sections import checkpointer_sections
from kubetune.trainer.config import config_keys, lora_scale
from kubetune.trainer.config.recipe_config import configs_dir
from kubetune.trainer.config.validate import check_nf4, check_values, lora_rank_excess
from kubetune.trainer.objectives.objective import Objective
from kubetune.trainer.planning.tokenizer_section import tokenizer_section
from kubetune.trainer.request.tune_command import TuneRunRequest

def _model_section(cfg: DictConfig, checkpoint: CheckpointModel, method: str,
                   config_name: str) -> list[str]:
    arch = checkpoint.architecture
    model_cfg = cfg.get("model") or OmegaConf.create({})
    lora = method != "full"
    component = arch.component(lora)
    notes = []
    if model_cfg.get("_component_") != component:
        notes.append(f"model: config {config_name} names {model_cfg.get('_component_')}; "
                     f"the checkpoint's config.json is {arch.family} "
                     f"({arch.summary}): using {component}, tokenizer "
                     f"{checkpoint.tokenizer.component}, checkpointer {arch.checkpointer} "
                     f"(model_type {arch.model_type})")
    new_model = {"_component_": component, **arch.dims}
    if lora:
        new_model.update({k: model_cfg[k] for k in arch.lora_keys if k in model_cfg})
        if model_cfg.get("apply_lora_to_output") and "apply_lora_to_output" not in new_model:
            notes.append(f"model.apply_lora_to_output: {arch.family} ties its output to the "
                         "embeddings, and torchtune's LoRA builder for it trains no output "
                         "LoRA: the other modules get theirs")
        new_model["quantize_base"] = method == "qlora"
        new_model["use_dora"] = method == "dora"
    cfg.model = OmegaConf.create(new_model)
    return notes


# What torchtune's LoRA configs schedule with. Its full fine-tuning configs name no scheduler,
# so a warm-up length given there (`--warmup-steps`) would leave a section the recipe cannot
# instantiate.
WARMUP_SCHEDULER = "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup"
WARMUP_KEY = "lr_scheduler.num_warmup_steps"


def _lr_scheduler_section(cfg: DictConfig) -> list[str]:
    section = cfg.get("lr_scheduler")
    if not isinstance(section, DictConfig) or "_component_" in section:
        return []
    section._component_ = WARMUP_SCHEDULER
    return [f"lr_scheduler: the config names none; using {WARMUP_SCHEDULER} for the settings "
            f"given ({', '.join(k for k in section if k != '_component_')})"]


def fit_to_checkpoint(cfg: DictConfig, base: DictConfig, request: TuneRunRequest, recipe_path,
                      checkpoint: CheckpointModel, method: str, user_keys: set[str],
                      objective: Objective) -> list[str]:
    """The model, scheduler, checkpointer and tokenizer sections rebuilt for the checkpoint,
    with the override keys and values checked against what will be built (the sections
    ``objective`` fits to another model left to it)."""
    notes = _model_section(cfg, checkpoint, method, request.config)
    if method != "full":
        notes += lora_scale.keep_alpha_ratio(cfg, base, user_keys, request.config)
    notes += _lr_scheduler_section(cfg)
    notes += objective.fit_loss(cfg, user_keys)  # before the keys are checked against it
    in_order = [arg.lstrip("~").split("=", 1)[0] for arg in request.overrides]
    notes += config_keys.check(in_order, base, cfg, Path(recipe_path), configs_dir())
    check_values(cfg, request.spellings)
    if method != "full":
        excess = lora_rank_excess(cfg.model, checkpoint.architecture.dims, request.spellings)
        if excess and "model.lora_rank" in user_keys:
            raise BadInputError(excess)
        if excess:  # the config's default, sized for bigger models: the user chose nothing
            notes.append(f"{excess} (the rank is config {request.config}'s default)")
    if method == "qlora":
        check_nf4(checkpoint.architecture.dims)
    checkpointer_sections(cfg, checkpoint, user_keys, objective.own_checkpointers)
    taken = tokenizer_section(cfg, checkpoint, user_keys)
    config_keys.check_rebuilt_sections([k for k in in_order if k not in taken], cfg)
    return notes
