"""What the run was, for ``summary.json``'s ``objective`` (the exporter's manifest and model
card read it there): the objective, the method, the recipe, the loss, and the model the
objective compares against where it has one (a DPO run's reference, a distillation run's
teacher)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from kubetune.trainer.objectives import choice
from kubetune.trainer.planning.plan import RunPlan
from kubetune.workspace.model_files import original_repo_id


def objective_of_plan(plan_: RunPlan) -> str:
    """The run's objective, read from its recipe's name as the plan reads it
    (``choice.objective_of``): the one place the launcher asks."""
    return choice.objective_of(Path(plan_.recipe_path).stem)


def _model(cfg: DictConfig, section: str) -> dict[str, Any] | None:
    """A checkpointer section's model: its directory and the repo it came from."""
    where = OmegaConf.select(cfg, f"{section}.checkpoint_dir", default=None)
    if where is None:
        return None
    return {"checkpoint_dir": str(where), "name": original_repo_id(Path(str(where)))}


def section(plan_: RunPlan) -> dict[str, Any]:
    """``summary.json``'s ``objective``."""
    cfg = plan_.cfg
    name = objective_of_plan(plan_)
    out: dict[str, Any] = {"name": name, "method": plan_.method,
                           "recipe": Path(plan_.recipe_path).stem,
                           "loss": OmegaConf.select(cfg, "loss._component_", default=None)}
    if name == choice.DPO:
        separate = _model(cfg, "ref_checkpointer")
        out["reference"] = {**separate, "kind": "a frozen copy"} if separate else {
            **(_model(cfg, "checkpointer") or {}),
            "kind": "the base model (the policy with its adapters off)"}
        out["beta"] = OmegaConf.select(cfg, "loss.beta", default=None)
    elif name == choice.DISTILL:
        out["teacher"] = _model(cfg, "teacher_checkpointer")
        out["kd_ratio"] = OmegaConf.select(cfg, "kd_ratio", default=None)
        out["kd_loss"] = OmegaConf.select(cfg, "kd_loss._component_", default=None)
    return {key: value for key, value in out.items() if value is not None}
