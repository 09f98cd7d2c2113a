"""Stop after ``patience`` evaluations in a row without a val_loss below the best so far
(``kubetune.validation.early_stop_patience``; 0 = never). The base (step 0) sets the
first best; a resumed run replays its record's evaluations to the same counters.

Evaluations within the learning-rate warm-up (``warmup_steps``) may set a new best but
never count against the patience: there the learning rate is still near 0 (at step 1 of
a warm-up, exactly 0), so the loss cannot have improved yet, and a patience of 1 would stop
the run at its first step with the base as its best."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping


@dataclass
class EarlyStop:
    patience: int
    best_val_loss: float | None = None
    best_step: int | None = None
    since_best: int = 0
    warmup_steps: int = 0

    def observe(self, step: int, val_loss: float) -> bool:
        """Count one evaluation; True when the patience is used up."""
        if self.best_val_loss is None or val_loss < self.best_val_loss:
            self.best_val_loss, self.best_step, self.since_best = val_loss, step, 0
        elif step > self.warmup_steps:
            self.since_best += 1
        return self.exhausted

    @property
    def exhausted(self) -> bool:
        return self.patience > 0 and self.since_best >= self.patience

    @classmethod
    def replayed(cls, patience: int, evaluations: Iterable[Mapping],
                 warmup_steps: int = 0) -> "EarlyStop":
        state = cls(patience, warmup_steps=warmup_steps)
        for evaluation in evaluations:
            state.observe(int(evaluation["step"]), float(evaluation["val_loss"]))
        return state

    def describe(self) -> dict:
        """The record's ``early_stop`` fields, less the step it stopped at."""
        return {"patience": self.patience, "best_step": self.best_step,
                "best_val_loss": self.best_val_loss}
