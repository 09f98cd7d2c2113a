"""Stop after ``patience`` evaluations in a row without a val_loss below the best so far
(``kubetune.validation.early_stop_patience``; 0 = never). The base (step 0) sets the
first best; a resumed run replays its record's evaluations to the same counters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping


@dataclass
class EarlyStop:
    patience: int
    best_val_loss: float | None = None
    best_step: int | None = None
    since_best: int = 0

    def observe(self, step: int, val_loss: float) -> bool:
        """Count one evaluation; True when the patience is used up."""
        if self.best_val_loss is None or val_loss < self.best_val_loss:
            self.best_val_loss, self.best_step, self.since_best = val_loss, step, 0
        else:
            self.since_best += 1
        return self.exhausted

    @property
    def exhausted(self) -> bool:
        return self.patience > 0 and self.since_best >= self.patience

    @classmethod
    def replayed(cls, patience: int, evaluations: Iterable[Mapping]) -> "EarlyStop":
        state = cls(patience)
        for evaluation in evaluations:
            state.observe(int(evaluation["step"]), float(evaluation["val_loss"]))
        return state

    def describe(self) -> dict:
        """The record's ``early_stop`` fields, less the step it stopped at."""
        return {"patience": self.patience, "best_step": self.best_step,
                "best_val_loss": self.best_val_loss}
