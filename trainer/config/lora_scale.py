"""A LoRA rank given without an alpha keeps the config's alpha/rank ratio.

LoRA scales its update by ``lora_alpha / lora_rank``. A config's alpha is sized for its
own rank (torchtune's 1B configs: 128 for rank 64, a scale of 2), so a rank set alone
(``KUBETUNE_LORA_RANK=8``, ``model.lora_rank=8``, ``LORA_CONFIG='{"r": 8}'``) would keep
alpha 128 and multiply the scale, hence the effective learning rate, by 8. An alpha the
user sets stays as given.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

RANK, ALPHA = "model.lora_rank", "model.lora_alpha"


def keep_alpha_ratio(cfg: DictConfig, base: DictConfig, user_keys: set[str],
                     config_name: str) -> list[str]:
    """Set ``cfg``'s alpha to the base config's ratio times the rank the user set, when
    they set the rank and not the alpha; return the one line saying so (or none)."""
    if RANK not in user_keys or ALPHA in user_keys:
        return []
    base_rank = OmegaConf.select(base, RANK, default=None)
    base_alpha = OmegaConf.select(base, ALPHA, default=None)
    rank = OmegaConf.select(cfg, RANK, default=None)
    numbers = (base_rank, base_alpha, rank)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numbers) \
            or base_rank <= 0 or rank == base_rank:
        return []
    alpha = base_alpha * rank / base_rank
    alpha = int(alpha) if float(alpha).is_integer() else alpha
    cfg.model.lora_alpha = alpha
    return [f"model.lora_alpha={alpha}: model.lora_rank={rank} was set without an alpha, so "
            f"it keeps config {config_name}'s alpha/rank ratio ({base_alpha}/{base_rank}, a "
            f"LoRA scale of {base_alpha / base_rank:g}); set model.lora_alpha to choose it"]
