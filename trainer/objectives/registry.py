"""Every objective, by name: the one list. An objective is a module with one
``Objective`` (``objective``) and an entry here; ``--objective``'s choices, `kubetune
size`, the plan, the recipe process and the reports all read it from here.

The run's objective is resolved once (``resolve``: the one named by ``--objective`` or
KUBETUNE_OBJECTIVE, else the one whose recipe a drop-in `tune run` names), stored in
the merged config (``kubetune.objective``), and read back from it (``of_config``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubetune import env
from kubetune.errors import BadInputError
from kubetune.trainer.objectives import distill, dpo, rso, sft
from kubetune.trainer.objectives.objective import CONFIG_KEY, LoggedPart, Objective

OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    sft.OBJECTIVE, dpo.OBJECTIVE, distill.OBJECTIVE, rso.OBJECTIVE)}
NAMES = tuple(OBJECTIVES)
SFT = sft.OBJECTIVE


def get(name: str) -> Objective:
    if name not in OBJECTIVES:
        raise BadInputError(f"objective {name!r} is not one of {', '.join(NAMES)}")
    return OBJECTIVES[name]


def of_recipe(recipe: str) -> Objective:
    """The objective a recipe (a name, or a recipe file's path) trains: the first whose
    recipes name it; SFT for a recipe none names (a user's own)."""
    stem = Path(recipe).stem if recipe.endswith(".py") else recipe
    return next((o for o in OBJECTIVES.values() if stem in o.recipes), SFT)


def resolve(named: str | None, recipe: str) -> Objective:
    """The run's objective: ``named`` (KUBETUNE_OBJECTIVE, ``--objective``) where the
    recipe trains it (or is a recipe of the user's own), else the recipe's. A named one
    that another objective's recipe cannot train is refused."""
    runs = of_recipe(recipe)
    if named is None:
        return runs
    chosen = get(named)
    theirs = [o for o in OBJECTIVES.values() if Path(recipe).stem in o.recipes]
    if theirs and chosen not in theirs:
        raise BadInputError(f"{env.OBJECTIVE}={named}, but the command runs {recipe} "
                            f"({runs.name}): the recipe chooses the objective in `tune run`; "
                            f"unset {env.OBJECTIVE} or set it to {runs.name}")
    return chosen


def of_config(cfg: Any) -> Objective:
    """The objective a merged config was planned for (its ``kubetune.objective``); SFT
    for a config saved before the objective was stored."""
    section = cfg.get("kubetune") if hasattr(cfg, "get") else None
    name = section.get(CONFIG_KEY) if hasattr(section, "get") else None
    return get(str(name)) if name else SFT


def logged_parts() -> tuple[LoggedPart, ...]:
    """What any objective's recipes log beside the loss, each once."""
    parts: dict[str, LoggedPart] = {}
    for objective in OBJECTIVES.values():
        parts.update({p.key: p for p in objective.logged_parts if p.key not in parts})
    return tuple(parts.values())


def summary_sections() -> dict[str, tuple[LoggedPart, ...]]:
    """summary.json's section for each objective's logged parts (``preference``,
    ``distillation``), each once."""
    sections: dict[str, tuple[LoggedPart, ...]] = {}
    for objective in OBJECTIVES.values():
        if objective.summary_section and objective.summary_section not in sections:
            sections[objective.summary_section] = objective.logged_parts
    return sections
