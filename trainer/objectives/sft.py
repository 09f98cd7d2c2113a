"""Supervised fine-tuning: imitate the answers. torchtune's fine-tuning recipes, chosen
per method and topology as Kubeflow Trainer's torch plugin chooses them
(``kubetune.trainer.request.methods``); every default of ``Objective`` is this one's."""

from __future__ import annotations

from kubetune.trainer.objectives.objective import Objective
from kubetune.trainer.request import methods
from kubetune.trainer.request.topology import Topology


class SFT(Objective):
    name = "sft"
    recipes = methods.RECIPES

    def recipe_for(self, method: str, topology: Topology | None = None,
                   spellings: dict[str, str] | None = None) -> tuple[str, str, list[str]]:
        # The controller's choice, which also knows several nodes (its multi-node recipe).
        return methods.recipe_for(method, topology)


OBJECTIVE = SFT()
