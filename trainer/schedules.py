"""Learning-rate schedules torchtune 0.6.1 does not ship, as config components with the
signature its recipes call (optimizer, num_warmup_steps, num_training_steps, last_epoch)."""

from __future__ import annotations

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def linear_schedule_with_warmup(optimizer: Optimizer, num_warmup_steps: int,
                                num_training_steps: int, last_epoch: int = -1) -> LambdaLR:
    """Linear warm-up to the peak, then linear decay to zero at the last step."""

    def factor(step: int) -> float:
        if step < num_warmup_steps:
            return (step + 1) / max(1, num_warmup_steps)
        remaining = num_training_steps - step
        return max(0.0, remaining / max(1, num_training_steps - num_warmup_steps))

    return LambdaLR(optimizer, factor, last_epoch)
