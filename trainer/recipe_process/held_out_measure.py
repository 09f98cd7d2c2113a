"""What an evaluation of the held-out set measures, by the run's objective: SFT's token
cross-entropy (``val_loop``), a DPO run's loss, rewards and margins on held-out pairs
(``preference_held_out``), or a distillation run's cross-entropy with its KD term beside
it (``distill_held_out``). Each gives ``val_loss`` (what the best checkpoint and early
stopping read) and ``val_tokens``, and its own numbers beside them."""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from kubetune.trainer.objectives import choice
from kubetune.trainer.validation import distill_held_out, preference_held_out, val_loop


def objective_of_recipe(recipe: Any) -> str:
    """The run's objective, read from the recipe file's name as the plan reads it
    (``choice.objective_of``): the one place the recipe process asks."""
    module = sys.modules.get(type(recipe).__module__)
    return choice.objective_of(Path(getattr(module, "__file__", "") or "").stem)


def _sft_collate(cfg: Any, recipe: Any) -> Callable[[list[dict]], dict]:
    """The recipe's collate for unpacked rows (validation is never packed)."""
    from torchtune.config._utils import _get_component_from_path

    collate = _get_component_from_path(cfg.get("collate_fn", "torchtune.data.padded_collate_sft"))
    return functools.partial(collate, padding_idx=recipe._tokenizer.pad_id,
                             ignore_idx=recipe._loss_fn.ignore_index)


@dataclass
class Measure:
    objective: str
    collate: Callable[[list[dict]], Any]

    def numbers(self, recipe: Any, dataset: Any, batch_size: int, rank: int, world: int,
                progress: Any = None) -> dict[str, float | int]:
        """``val_loss``, ``val_tokens`` and the objective's own numbers."""
        if self.objective == choice.DPO:
            return preference_held_out.measure(recipe, dataset, batch_size, rank, world,
                                               progress)
        if self.objective == choice.DISTILL and distill_held_out.is_distillation(recipe):
            return distill_held_out.measure(recipe, dataset, batch_size, self.collate, rank,
                                            world, progress)
        loss, tokens = val_loop.held_out_loss(recipe, dataset, batch_size, self.collate, rank,
                                              world, progress)
        return {"val_loss": loss, "val_tokens": tokens}

    @property
    def unit(self) -> str:
        """What one held-out row is, in the log's words."""
        return "preference pairs" if self.objective == choice.DPO else "rows"

    def answer_rows(self, dataset: Any) -> Any:
        """The held-out rows the answers are asked from: a pair's chosen side (its answer
        the reference), else the rows themselves."""
        return preference_held_out.ChosenSide(dataset) if self.objective == choice.DPO \
            else dataset


def for_recipe(recipe: Any, cfg: Any) -> Measure:
    objective = objective_of_recipe(recipe)
    collate = preference_held_out.collate(recipe) if objective == choice.DPO \
        else _sft_collate(cfg, recipe)
    return Measure(objective, collate)
