"""A learning-rate warm-up the user did not choose never outlasts the run.

torchtune's LoRA configs warm up over 100 steps, sized for runs of thousands; a run of
40 rows makes a handful of steps and would never leave the warm-up (3 steps of a
100-step warm-up peak at 3 % of ``optimizer.lr``). The run's own optimizer-step count is
exact only here, once the recipe has its data loader: its ``setup`` builds the scheduler
after ``_setup_data``, from epochs x steps per epoch (after ``max_steps_per_epoch``, per
gradient-accumulation step). So the scheduler's builder is wrapped: where the plan says
the user set no warm-up (``kubetune.cap_warmup``), one longer than ``WARMUP_SHARE`` of
those steps is cut to it, with one line. A warm-up the user set stays as set (the
launcher warns when it covers the whole run: ``train_progress.warn_about_warmup``).
A capped warm-up is written into the saved config (``saved_config.record_ran``): the
card and the volume say the warm-up that ran, not the config's.

And every warm-up starts above zero: torchtune's schedules give step 1 ``0 / warmup`` of
the learning rate, a step of compute that changes nothing; here step ``i`` (from 0) of a
warm-up of ``w`` runs at ``(i + 1) / w``, reaching ``optimizer.lr`` at the warm-up's last
step instead of the step after it.
"""

from __future__ import annotations

import functools
import inspect
import logging
from pathlib import Path
from typing import Any, Callable

from torch.optim.lr_scheduler import LambdaLR

from kubetune.trainer.config.saved_config import record_ran
from kubetune.trainer.request import passed_env

log = logging.getLogger("trainer")

# A tenth of the run: a common warm-up share, and short enough that the run spends
# nearly all its steps at (and decaying from) the configured learning rate.
WARMUP_SHARE = 0.1
WARMUP_KEY = "num_warmup_steps"


def capped_warmup(configured: int, total_steps: int) -> int:
    """The warm-up a run of ``total_steps`` optimizer steps gets for ``configured``."""
    return min(configured, int(total_steps * WARMUP_SHARE))


def starting_above_zero(scheduler: Any, warmup: int) -> None:
    """``scheduler``'s warm-up (its first ``warmup`` steps) moved one step earlier, its
    current learning rate set again from it (a resumed one is past step 0 already)."""
    if not isinstance(scheduler, LambdaLR) or warmup <= 0:
        return  # another kind names no warm-up in steps we could move

    def shifted(schedule: Callable[[int], float]) -> Callable[[int], float]:
        return lambda step: schedule(step + 1) if 0 <= step < warmup else schedule(step)

    scheduler.lr_lambdas = [shifted(schedule) for schedule in scheduler.lr_lambdas]
    for group, base, schedule in zip(scheduler.optimizer.param_groups, scheduler.base_lrs,
                                     scheduler.lr_lambdas):
        group["lr"] = base * schedule(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]


def wrap_setup_lr_scheduler(original: Callable, config_path: Path, cap: bool) -> Callable:
    """The recipe's ``_setup_lr_scheduler(cfg_lr_scheduler, num_training_steps, ...)``,
    with the scheduler's warm-up capped first where ``cap`` (in the recipe's config, so
    that what the launcher reads from it afterwards is what runs, and in the saved config
    at ``config_path``), and started above zero after."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def setup_lr_scheduler(self, *args: Any, **kwargs: Any):
        bound = signature.bind(self, *args, **kwargs)
        section = bound.arguments.get("cfg_lr_scheduler")
        total = bound.arguments.get("num_training_steps")
        configured = section.get(WARMUP_KEY) if section is not None else None
        if cap and isinstance(configured, int) and isinstance(total, int) and total > 0:
            capped = capped_warmup(configured, total)
            if capped < configured:
                section[WARMUP_KEY] = capped
                if passed_env.is_primary():
                    record_ran(config_path, f"lr_scheduler.{WARMUP_KEY}", capped)
                    log.info("lr_scheduler.num_warmup_steps: %d -> %d (%.0f%% of this run's "
                             "%d optimizer step(s)): the config's warm-up would keep the "
                             "learning rate below optimizer.lr for %s; set "
                             "lr_scheduler.num_warmup_steps to choose it", configured, capped,
                             WARMUP_SHARE * 100, total,
                             "the whole run" if configured >= total
                             else f"{configured / total:.0%} of the run")
        scheduler = original(*bound.args, **bound.kwargs)
        warmup = section.get(WARMUP_KEY) if section is not None else None
        if isinstance(warmup, int):
            starting_above_zero(scheduler, warmup)
        return scheduler

    return setup_lr_scheduler
