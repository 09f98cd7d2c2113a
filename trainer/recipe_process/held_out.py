"""Validation around an unmodified torchtune recipe (0.6.1's have no validation loop).

After the recipe's setup (``recipe_hooks``), the held-out dataset named by ``dataset_val``
is built with the recipe's tokenizer through the token cache, unpacked, and measured as the
run's objective measures it (``held_out_measure``: SFT's token loss, a DPO run's pairs with
their rewards, a distillation run's loss with its KD term). The step guard's
loader asks ``at_boundary`` at every optimizer-step boundary, and the epoch-save wrapper
asks ``before_epoch_save`` (an epoch cut short by ``max_steps_per_epoch`` ends without
another boundary); ``kubetune.trainer.validation.schedule`` says which steps are measured.
Every evaluation is logged through the recipe's metric logger and written to the record
(``kubetune.workspace.validation_record``, rank 0); each epoch checkpoint's loss is added
once it is committed. Always before a save: on CPU torchtune's LoRA save folds the adapter
into the live weights.

Early stop: once ``early_stop_patience`` evaluations in a row after the learning-rate
warm-up have not bettered the best, the epoch ends at that boundary, ``total_epochs`` is
cut to it so the recipe's own epoch save is its final one (no optimizer state), and the
next epoch's start raises ``step_guard.EarlyStopped``: the process ends 0, the run
completed.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from omegaconf import DictConfig, OmegaConf

from kubetune.phase_progress import PhaseProgress
from kubetune.workspace import TRAINER_CONFIG_NAME, validation_record
from kubetune.workspace.validation_record import ValidationRecord
from kubetune.trainer.config.saved_config import record_ran
from kubetune.trainer.data.token_cache.settings import CacheSettings
from kubetune.trainer.recipe_process import held_out_measure, tokenized_data
from kubetune.trainer.recipe_process.step_guard import Guard
from kubetune.trainer.validation import answers, budget, val_loop
from kubetune.trainer.validation.early_stop import EarlyStop
from kubetune.trainer.validation.schedule import Schedule, every_n_steps

log = logging.getLogger("trainer")


def _world() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _bounded(recipe: Any, dataset: Any, total_steps: int, every_n: int) -> Any:
    """The held-out rows each evaluation measures: the first ones, within the budget."""
    from torch.utils.data import Subset

    evaluations = 1 + total_steps // max(1, every_n) + int(recipe.total_epochs)
    keep = budget.rows_per_evaluation(dataset, recipe._dataloader.dataset,
                                      int(recipe.total_epochs), evaluations)
    return dataset if keep >= len(dataset) else Subset(dataset, range(keep))


def steps_per_epoch(recipe: Any) -> int:
    """Optimizer steps per epoch, as the step guard counts them."""
    accum = max(1, int(getattr(recipe, "_gradient_accumulation_steps", 1)))
    steps = len(recipe._dataloader) // accum
    if recipe.max_steps_per_epoch is not None:
        steps = min(steps, recipe.max_steps_per_epoch)
    return steps


def _warmup_steps(cfg: DictConfig) -> int:
    """The run's learning-rate warm-up (capped already: ``warmup_cap`` runs in setup)."""
    steps = OmegaConf.select(cfg, "lr_scheduler.num_warmup_steps", default=None)
    return steps if isinstance(steps, int) and steps > 0 else 0


def _answers_allowed(recipe: Any) -> float | None:
    """Forward positions each set of held-out answers may cost (``budget``): the run's
    own training tokens, as far as ``max_steps_per_epoch`` lets it go."""
    batches = max(1, len(recipe._dataloader))
    accum = max(1, int(getattr(recipe, "_gradient_accumulation_steps", 1)))
    fraction = min(1.0, steps_per_epoch(recipe) * accum / batches)
    return budget.answer_forward_tokens(recipe._dataloader.dataset, int(recipe.total_epochs),
                                        fraction)


class HeldOut:
    """The held-out set of one recipe process, its schedule, early stop and record."""

    def __init__(self, recipe: Any, cfg: DictConfig, settings: dict, guard: Guard,
                 dataset: Any, every_n: int) -> None:
        section = settings.get("validation") or {}
        self.guard = guard
        self.dataset = dataset
        self.batch_size = int(cfg.batch_size)
        self.measure = held_out_measure.for_recipe(recipe, cfg)
        self.world = _world()
        self.section = section  # prompts and max_new_tokens: the answers' own defaults
        # The whole held-out set (set_up: beyond the measured), as rows with an answer.
        self.prompt_rows = self.measure.answer_rows(dataset)
        resumed = bool(recipe._resume_from_checkpoint) and guard.resume_global_step is not None
        self.schedule = Schedule(every_n, steps_per_epoch(recipe), int(recipe.total_epochs),
                                 resumed=resumed)
        self.record = validation_record.read(guard.output_dir) if resumed else None
        if self.record is not None:
            self.record.cut_to(guard.resume_global_step)
        else:
            self.record = ValidationRecord(
                source=section.get("source", "config"), split=section.get("split"),
                train_split=section.get("train_split"), fraction=section.get("fraction"))
        self.record.rows, self.record.every_n_steps = len(dataset), every_n
        for evaluation in self.record.evaluations:
            self.schedule.mark(int(evaluation["step"]))
        self.early = EarlyStop.replayed(int(section.get("early_stop_patience") or 0),
                                        self.record.evaluations, _warmup_steps(cfg))
        self.stopped_at: int | None = None
        self._write()

    @classmethod
    def set_up(cls, recipe: Any, cfg: DictConfig, settings: dict, guard: Guard,
               data: CacheSettings) -> "HeldOut | None":
        """The run's held-out set, or None: no ``dataset_val``, or validation off (0)."""
        dataset_val = cfg.get("dataset_val")
        if dataset_val is None:
            return None
        total = steps_per_epoch(recipe) * int(recipe.total_epochs)
        every_n = every_n_steps(cfg.get("run_val_every_n_steps"), total)
        if every_n == 0:
            return None
        if guard.rank == 0:
            # null (about ten per run) resolved to this run's steps: the saved config says
            # the cadence that ran.
            record_ran(guard.output_dir / TRAINER_CONFIG_NAME, "run_val_every_n_steps", every_n)
        dataset = tokenized_data.build_held_out(recipe, dataset_val, data)
        if len(dataset) == 0:
            return None  # A refuses an empty held-out split in the plan (exit 65)
        measured = _bounded(recipe, dataset, total, every_n)
        held = cls(recipe, cfg, settings, guard, measured, every_n)
        held.prompt_rows = held.measure.answer_rows(dataset)
        if guard.rank == 0:
            of = "" if len(measured) == len(dataset) else (
                f" (the first {len(measured)} of {len(dataset)}: validation bounded to about "
                f"{budget.SHARE:.0%} of the run's compute)")
            log.info("validation: %d held-out %s%s, every %d step(s) of %d%s",
                     len(measured), held.measure.unit, of, every_n, total,
                     f", early stop after {held.early.patience} without improvement"
                     if held.early.patience else "")
        return held

    # -- when ----------------------------------------------------------------------------

    def at_boundary(self, recipe: Any, epoch_end: bool) -> bool:
        """Measure this step boundary if due; True when the run stops early here."""
        step = int(recipe.global_step)
        if self.schedule.due(step, epoch_end):
            self.evaluate(recipe, step, recipe.epochs_run)
        return self._stop_here(recipe, step, recipe.epochs_run)

    def before_epoch_save(self, recipe: Any, epoch: int, progress: Any = None) -> None:
        """The epoch's end (its last step), before the recipe's save of it."""
        step = int(recipe.global_step)
        if self.schedule.due(step, epoch_end=True):
            self.evaluate(recipe, step, epoch)
        if self._stop_here(recipe, step, epoch) and progress is not None:
            progress.total_epochs = recipe.total_epochs  # CheckpointClient's copy of it
        if epoch + 1 >= recipe.total_epochs:
            self._answers(recipe, "tuned", step)

    def _stop_here(self, recipe: Any, step: int, epoch: int) -> bool:
        if self.stopped_at is not None:
            return True
        if not self.early.exhausted or step >= self.schedule.total_steps:
            return False
        self.stopped_at = step
        self.guard.early_stopped = True
        recipe.total_epochs = epoch + 1  # the epoch's own save becomes the final one
        self.record.early_stop = {"patience": self.early.patience, "step": step,
                                  "best_step": self.early.best_step,
                                  "best_val_loss": self.early.best_val_loss}
        self._write()
        if self.guard.rank == 0:
            log.info("early stop at step %d: no improvement in %d evaluations (best val_loss "
                     "%.4f at step %d)", step, self.early.patience, self.early.best_val_loss,
                     self.early.best_step)
        return True

    # -- what ----------------------------------------------------------------------------

    def evaluate(self, recipe: Any, step: int, epoch: int) -> None:
        started = time.perf_counter()
        count = val_loop.batch_count(len(self.dataset), self.batch_size, self.world)
        with PhaseProgress(f"validation at step {step}", count, "batches",
                           self._emit()) as progress:
            numbers = self.measure.numbers(recipe, self.dataset, self.batch_size,
                                           self.guard.rank, self.world, progress)
        seconds = time.perf_counter() - started
        loss, tokens = numbers["val_loss"], numbers["val_tokens"]
        self.schedule.mark(step)
        self.early.observe(step, loss)
        self.record.tokens = tokens
        self.record.evaluations.append({"step": step, "epoch": int(epoch), **numbers})
        self._write()
        logger = getattr(recipe, "_metric_logger", None)
        if self.guard.rank == 0 and logger is not None:
            logger.log_dict(numbers, step=step)
            if hasattr(logger, "note_validation_s"):
                # The recipe times its next step from before this evaluation: its tokens/s
                # would count these seconds as training's.
                logger.note_validation_s(seconds)
        if step == 0:
            self._answers(recipe, "base", step)

    def after_epoch_save(self, recipe: Any, epoch: int) -> None:
        """The committed epoch checkpoint's held-out loss, into the record."""
        step = int(recipe.global_step)
        evaluation = self.record.evaluation_at(step)
        self.record.checkpoints[f"epoch_{epoch}"] = {
            "step": step, "val_loss": evaluation["val_loss"] if evaluation else None}
        self._write()

    def _answers(self, recipe: Any, which: str, step: int) -> None:
        """A few held-out prompts answered, base or tuned (every rank; rank 0 records)."""
        started = time.perf_counter()
        answers.record_answers(recipe, self.prompt_rows, self.section, self.guard.output_dir,
                               self.guard.rank, step, which, _answers_allowed(recipe))
        logger = getattr(recipe, "_metric_logger", None)
        if self.guard.rank == 0 and hasattr(logger, "note_validation_s"):
            logger.note_validation_s(time.perf_counter() - started)  # as evaluate's seconds

    def _emit(self):
        """Where progress lines go: rank 0's log (every rank runs the same batches)."""
        return log.info if self.guard.rank == 0 else None

    def _write(self) -> None:
        if self.guard.rank == 0:
            validation_record.write(self.guard.output_dir, self.record)
