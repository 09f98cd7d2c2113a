"""The objective a run asks for (``--objective``, ``KUBETUNE_OBJECTIVE``) -> the recipe,
base config and implied overrides `kubetune train` and `kubetune local` run."""

from __future__ import annotations

from kubetune.errors import BadInputError
from kubetune.trainer.objectives import dpo
from kubetune.trainer.request import methods
from kubetune.trainer.request.topology import Topology

SFT = "sft"
OBJECTIVES = (SFT, dpo.NAME)


def recipe_for(objective: str, method: str, topology: Topology | None = None
               ) -> tuple[str, str, list[str]]:
    """The recipe, base config and implied overrides for ``method`` trained with
    ``objective`` on ``topology``."""
    if objective == SFT:
        return methods.recipe_for(method, topology)
    if objective == dpo.NAME:
        if method not in methods.METHODS:
            return methods.recipe_for(method, topology)  # its line names the methods
        return dpo.recipe_for(method, topology)
    raise BadInputError(f"objective {objective!r} is not one of {', '.join(OBJECTIVES)}")


def objective_of(recipe: str) -> str:
    """The objective a recipe (name or path) trains with."""
    return dpo.NAME if dpo.is_dpo(recipe) else SFT
