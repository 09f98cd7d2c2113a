"""What an evaluation of the held-out set measures, as the run's objective says
(``Objective.held_out_metrics``, the objective read from the config the plan stored it
in): the token cross-entropy (``val_loop``: SFT), a preference loss, rewards and margins
on held-out pairs (``preference_held_out``: DPO, RSO), or the cross-entropy with the KD
term beside it (``distill_held_out``: distillation). Each gives ``val_loss`` (what the best checkpoint and early
stopping read) and ``val_tokens``, and its own numbers beside them."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from kubetune.trainer.objectives import registry
from kubetune.trainer.validation import distill_held_out, preference_held_out, val_loop

PREFERENCE, CROSS_ENTROPY_AND_KD = "preference", "cross_entropy_and_kd"


def _sft_collate(cfg: Any, recipe: Any) -> Callable[[list[dict]], dict]:
    """The recipe's collate for unpacked rows (validation is never packed)."""
    from torchtune.config._utils import _get_component_from_path

    collate = _get_component_from_path(cfg.get("collate_fn", "torchtune.data.padded_collate_sft"))
    return functools.partial(collate, padding_idx=recipe._tokenizer.pad_id,
                             ignore_idx=recipe._loss_fn.ignore_index)


@dataclass
class Measure:
    metrics: str  # the objective's ``held_out_metrics``
    collate: Callable[[list[dict]], Any]

    def numbers(self, recipe: Any, dataset: Any, batch_size: int, rank: int, world: int,
                progress: Any = None) -> dict[str, float | int]:
        """``val_loss``, ``val_tokens`` and the objective's own numbers."""
        if self.metrics == PREFERENCE:
            return preference_held_out.measure(recipe, dataset, batch_size, rank, world,
                                               progress)
        if self.metrics == CROSS_ENTROPY_AND_KD and distill_held_out.holds_teacher(recipe):
            return distill_held_out.measure(recipe, dataset, batch_size, self.collate, rank,
                                            world, progress)
        loss, tokens = val_loop.held_out_loss(recipe, dataset, batch_size, self.collate, rank,
                                              world, progress)
        return {"val_loss": loss, "val_tokens": tokens}

    @property
    def unit(self) -> str:
        """What one held-out row is, in the log's words."""
        return "preference pairs" if self.metrics == PREFERENCE else "rows"

    def answer_rows(self, dataset: Any) -> Any:
        """The held-out rows the answers are asked from: a pair's chosen side (its answer
        the reference), else the rows themselves."""
        return preference_held_out.ChosenSide(dataset) if self.metrics == PREFERENCE \
            else dataset


def for_recipe(recipe: Any, cfg: Any) -> Measure:
    """The measure of ``recipe``'s run: its objective's, as the plan stored it in ``cfg``."""
    metrics = registry.of_config(cfg).held_out_metrics
    collate = preference_held_out.collate(recipe) if metrics == PREFERENCE \
        else _sft_collate(cfg, recipe)
    return Measure(metrics, collate)
