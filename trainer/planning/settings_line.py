"""One line before step 1 naming the method's LoRA settings and the dtype, each with why
it was chosen: the defaults differ by config (SFT's LoRA configs rank 64 / alpha 128 on
the attention and the MLP, DPO's rank 8 / alpha 16), and bf16 or fp32 follows the
machine, so a run's log says which it trains with before it spends a step on them."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from kubetune.trainer.config.lora_scale import ALPHA, RANK


def _why(key: str, user_keys: set[str], spellings: dict[str, str], config_name: str) -> str:
    if key in user_keys:
        return f"set by {spellings.get(key, key)}"
    if key == ALPHA and RANK in user_keys:
        return "the config's alpha/rank ratio kept for the rank set"
    return f"config {config_name}'s"


def _targets(model: DictConfig) -> str:
    targets = [str(name) for name in (model.get("lora_attn_modules") or [])]
    targets += ["MLP"] if model.get("apply_lora_to_mlp") else []
    targets += ["output"] if model.get("apply_lora_to_output") else []
    return ", ".join(targets) or "none"


def settings_line(cfg: DictConfig, base: DictConfig, method: str, config_name: str,
                  user_keys: set[str], spellings: dict[str, str],
                  hardware_notes: list[str]) -> str:
    """``method``'s LoRA rank, alpha and targets (a full fine-tune has none) and ``cfg``'s
    dtype, each with where it came from (``base``: the config before the overrides);
    ``hardware_notes``: the hardware's lines, which say where it changed the dtype."""
    parts = []
    model = cfg.get("model")
    if model is not None and OmegaConf.select(cfg, RANK, default=None) is not None:
        targets = ("the config's" if not {"model.lora_attn_modules", "model.apply_lora_to_mlp",
                                           "model.apply_lora_to_output"} & user_keys
                   else "as set")
        parts.append(
            f"{method}: rank {model.lora_rank} ({_why(RANK, user_keys, spellings, config_name)}),"
            f" alpha {model.get('lora_alpha')} "
            f"({_why(ALPHA, user_keys, spellings, config_name)}), on {_targets(model)} "
            f"({targets})")
    else:
        parts.append(f"{method}: every weight trained")
    dtype = cfg.get("dtype")
    if "dtype" in user_keys:
        why = f"set by {spellings.get('dtype', 'dtype')}"
    elif any("fp32" in note for note in hardware_notes):
        why = "; ".join(note for note in hardware_notes if "fp32" in note)
    else:
        source = f"config {config_name}'s" if base.get("dtype") else "the default"
        why = f"{source}, and this device computes it natively"
    parts.append(f"dtype {dtype} ({why})")
    return "training with " + "; ".join(parts)
