"""RSO ("hinge" loss, Liu et al. 2023): preference tuning as DPO, with torchtune's
``RSOLoss`` in place of ``DPOLoss``. The same recipes, data, refusals, memory and logged
rewards as ``dpo`` (it is DPO's objective with another loss), so adding it took this
module and one entry in ``registry``: what torchtune already ships for preference pairs
needs no more.

The loss is set where the user named none (``loss._component_`` or the whole ``loss``
section); a ``loss.gamma=`` override keeps its value (RSOLoss's temperature, default 0.1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kubetune.trainer.objectives.dpo import DPO

if TYPE_CHECKING:
    from omegaconf import DictConfig

RSO_LOSS = "torchtune.rlhf.loss.RSOLoss"


class RSO(DPO):
    name = "rso"

    def fit_loss(self, cfg: "DictConfig", user_keys: set[str]) -> list[str]:
        from omegaconf import OmegaConf

        if {"loss", "loss._component_"} & user_keys:
            return []  # the user's own loss
        kept = {key.split(".", 1)[1]: cfg.loss[key.split(".", 1)[1]]
                for key in sorted(user_keys) if key.startswith("loss.")}
        old = OmegaConf.select(cfg, "loss._component_")
        cfg.loss = OmegaConf.create({"_component_": RSO_LOSS, **kept})
        return [f"loss: {RSO_LOSS} (objective rso; the config named {old})"]


OBJECTIVE = RSO()
