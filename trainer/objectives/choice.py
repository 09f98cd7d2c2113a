"""The objective a run asks for (``--objective``, ``KUBETUNE_OBJECTIVE``) -> the recipe,
base config and implied overrides `kubetune train` and `kubetune local` run. Light to
import (no omegaconf): the click options list its names."""

from __future__ import annotations

from kubetune.errors import BadInputError
from kubetune.trainer.request import methods
from kubetune.trainer.request.topology import Topology

SFT, DPO, DISTILL = "sft", "dpo", "distill"
OBJECTIVES = (SFT, DPO, DISTILL)


def recipe_for(objective: str, method: str, topology: Topology | None = None,
               spellings: dict[str, str] | None = None) -> tuple[str, str, list[str]]:
    """The recipe, base config and implied overrides for ``method`` trained with
    ``objective`` on ``topology`` (``spellings``: how the user sets things, for a
    refusal's hint)."""
    if objective not in OBJECTIVES:
        raise BadInputError(f"objective {objective!r} is not one of {', '.join(OBJECTIVES)}")
    if objective == SFT or method not in methods.METHODS:
        return methods.recipe_for(method, topology)  # a bad method: its line names them
    if objective == DISTILL:
        from kubetune.trainer.objectives import distill

        return distill.recipe_for(method, topology)
    from kubetune.trainer.objectives import dpo

    return dpo.recipe_for(method, topology, spellings)


def objective_of(recipe: str) -> str:
    """The objective a recipe (name or path) trains with."""
    from kubetune.trainer.objectives import distill, dpo

    if distill.is_distill(recipe):
        return DISTILL
    return DPO if dpo.is_dpo(recipe) else SFT
