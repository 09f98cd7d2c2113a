"""The recipe class's own methods, wrapped (never rewritten): its data set up through the
token cache (``tokenized_data``), with empty micro-batches harmless (``empty_batches``), a
warm-up capped and started above zero (``warmup_cap``) and samples recorded (``sample_capture``); its setup
handing the step guard the recipe and the progress logger its plan; every save checked
first (``run_sanity``: nothing trained, or garbage, is never saved) and vouched for by the
step guard after, through the recipe's own ``save_checkpoint`` or torchtune's
CheckpointClient, whichever the recipe saves with (a LoRA run's saves before its last
without the merged model: ``epoch_saves``); the held-out set (``held_out``) built
after setup, measured before each epoch's save and its checkpoint's loss recorded after.
"""

from __future__ import annotations

import functools

from kubetune.trainer.checkpointing import epoch_saves
from kubetune.trainer.data.token_cache.settings import CacheSettings
from kubetune.trainer.metric_logging import run_report, train_progress
from kubetune.trainer.recipe_process import (empty_batches, few_steps, held_out, run_sanity,
                                             sample_capture, save_progress, tokenized_data,
                                             warmup_cap)
from kubetune.trainer.recipe_process.step_guard import Guard
from kubetune.workspace import TRAINER_CONFIG_NAME


def defines_save(cls: type) -> bool:
    """Whether the recipe saves through its own method (LoRA, full single-device), not
    through torchtune's CheckpointClient (full distributed; the interface's stub)."""
    return any("save_checkpoint" in vars(k) for k in cls.__mro__
               if k.__module__ == cls.__module__)


def install(cls: type, guard: Guard, data: CacheSettings | None = None,
            cap_warmup: bool = False, fingerprint: str = "") -> None:
    if data is not None and hasattr(cls, "_setup_data"):
        cls._setup_data = tokenized_data.wrap_setup_data(cls._setup_data, data)
    empty_batches.install(cls)
    if hasattr(cls, "_setup_lr_scheduler"):
        # Its step count comes from the data loader, so from the rows the cache kept; every
        # warm-up, capped or not, starts above zero.
        cls._setup_lr_scheduler = warmup_cap.wrap_setup_lr_scheduler(
            cls._setup_lr_scheduler, guard.output_dir / TRAINER_CONFIG_NAME, cap_warmup)
    if hasattr(cls, "_setup_data"):
        # Outside the cache: its recorder sees the rows the cache tokenizes in this process,
        # and draws the first ones again from the rows the cache was made from
        # (``tokenized_from``) where the tokenizing happened in workers or a mapped entry
        # replaced it.
        cls._setup_data = sample_capture.wrap_setup_data(cls._setup_data, guard.output_dir,
                                                         fingerprint)
    _wrap_setup(cls, guard, data)
    if defines_save(cls):
        _wrap_own_save(cls, guard)
    else:
        _wrap_client_save(cls, guard)


def _wrap_setup(cls: type, guard: Guard, data: CacheSettings | None) -> None:
    """After the recipe's setup: the step guard and the progress logger get the recipe
    and its plan, and the held-out set is built with the recipe's tokenizer."""
    original_setup = cls.setup

    @functools.wraps(original_setup)
    def setup(self, *args, **kwargs):
        result = original_setup(self, *args, **kwargs)
        guard.after_setup(self)
        train_progress.hand_plan_to_logger(self)
        cfg = kwargs.get("cfg", args[0] if args else None)  # recipe_main: setup(cfg=cfg)
        if cfg is not None:
            train_progress.warn_about_warmup(self, cfg)
            few_steps.warn(self, cfg)
            if data is not None:
                guard.held_out = held_out.HeldOut.set_up(self, cfg, guard.settings, guard, data)
        return result

    cls.setup = setup


def _wrap_own_save(cls: type, guard: Guard) -> None:
    """The recipe's own ``save_checkpoint`` (LoRA, full single-device) checked before,
    measured on held-out data around, and vouched for after."""
    original_save = cls.save_checkpoint

    @functools.wraps(original_save)
    def save_checkpoint(self, epoch: int, *args, **kwargs):
        # Nothing trained, or garbage trained, is never saved (as a result or to resume).
        run_sanity.check_before_save(self, getattr(self, "_model", None), guard.asked_sizes)
        validated = guard.held_out if guard.forced_reason is None else None
        if validated is not None:
            validated.before_epoch_save(self, epoch)  # may make this save the final one
        checkpointer = getattr(self, "_checkpointer", None)
        original_dir = guard.before_save(checkpointer)
        resumable = epoch + 1 < self.total_epochs  # the recipe's own test, as it saves
        # Only the run's last save holds the merged model (a LoRA run's: epoch_saves).
        with epoch_saves.adapter_only_unless_final(self, guard.settings, not resumable), \
                save_progress.reporting(checkpointer, getattr(self, "_model", None), epoch,
                                        guard.rank):
            result = original_save(self, epoch, *args, **kwargs)
        guard.after_save(self, checkpointer, original_dir, self.epochs_run, epoch, resumable)
        if validated is not None:
            validated.after_epoch_save(self, epoch)
        _report_progress(guard, resumable)
        return result

    cls.save_checkpoint = save_checkpoint


def _wrap_client_save(cls: type, guard: Guard) -> None:
    """torchtune's CheckpointClient's save (full distributed recipes), wrapped as
    ``_wrap_own_save`` wraps a recipe's own; the recipe it saves for remembered at setup."""
    from torchtune.training.checkpointing._checkpoint_client import CheckpointClient

    original_client_save = CheckpointClient.save_checkpoint
    current: dict = {}

    @functools.wraps(original_client_save)
    def client_save(self, model, optimizer, training_progress, epoch, *args, **kwargs):
        recipe = current.get("recipe")
        run_sanity.check_before_save(recipe, model, guard.asked_sizes)
        validated = guard.held_out if guard.forced_reason is None else None
        if validated is not None and recipe is not None:
            validated.before_epoch_save(recipe, epoch, training_progress)
        checkpointer = self._get_checkpointer()
        original_dir = guard.before_save(checkpointer)
        with save_progress.reporting(checkpointer, model, epoch, guard.rank):
            result = original_client_save(self, model, optimizer, training_progress,
                                          epoch, *args, **kwargs)
        resumable = epoch + 1 < training_progress.total_epochs
        guard.after_save(recipe, checkpointer, original_dir,
                         training_progress.epochs_run, epoch, resumable)
        if validated is not None and recipe is not None:
            validated.after_epoch_save(recipe, epoch)
        _report_progress(guard, resumable)
        return result

    CheckpointClient.save_checkpoint = client_save
    inner_setup = cls.setup

    def remember(self, *args, **kwargs):
        current["recipe"] = self
        return inner_setup(self, *args, **kwargs)

    cls.setup = remember


def _report_progress(guard: Guard, resumable: bool) -> None:
    """The run report so far, after a checkpoint a restart may resume from. Not after the
    final one: the launcher writes the finished run's report moments later, and drawing
    the curves twice cost ~1.8 CPU s at the end of every run (matplotlib's import and one
    figure)."""
    if resumable:
        run_report.on_checkpoint(guard.output_dir, guard.rank)
