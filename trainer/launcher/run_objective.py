"""What the run was, for ``summary.json``'s ``objective`` (the exporter's manifest and model
card read it there): the objective the plan resolved and stored, the method, the recipe,
the loss, and what the objective says of itself (``Objective.described``: a DPO run's
reference, a distillation run's teacher)."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from kubetune.trainer.planning.plan import RunPlan


def section(plan_: RunPlan) -> dict[str, Any]:
    """``summary.json``'s ``objective``."""
    cfg = plan_.cfg
    out: dict[str, Any] = {"name": plan_.objective.name, "method": plan_.method,
                           "recipe": plan_.recipe_path.stem,
                           "loss": OmegaConf.select(cfg, "loss._component_", default=None),
                           **plan_.objective.described(cfg)}
    return {key: value for key, value in out.items() if value is not None}
