"""When the held-out loss is measured: at optimizer-step boundaries, each step at most once.

- step 0, before the first step (the base model), unless the run resumes (its record
  holds it already);
- every ``run_val_every_n_steps`` optimizer steps (``global_step % N == 0``); null: about
  ten evaluations per run, from the exact optimizer-step count;
- the last step of every epoch (each saved epoch checkpoint has a val loss), and so the
  run's last step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def every_n_steps(setting: Any, total_steps: int) -> int:
    """``run_val_every_n_steps`` resolved: an int > 0; null -> about ten per run; 0 off."""
    if setting is None:
        return max(1, round(total_steps / 10))
    return max(0, int(setting))


@dataclass
class Schedule:
    every_n: int
    steps_per_epoch: int
    total_epochs: int
    resumed: bool = False
    done: set[int] = field(default_factory=set)

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.total_epochs

    def due(self, step: int, epoch_end: bool) -> bool:
        """Whether ``step``'s boundary is measured (``epoch_end``: an epoch's last step)."""
        if step in self.done:
            return False
        if step == 0:
            # A resumed run's base is in its record; a step-0 boundary is never an epoch's end.
            return not self.resumed
        return epoch_end or step % self.every_n == 0 or step >= self.total_steps

    def mark(self, step: int) -> None:
        self.done.add(step)
