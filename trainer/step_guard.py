"""Step-level control around an unmodified torchtune recipe: stop on SIGTERM with a
resumable checkpoint, periodic step-level saves, and resuming mid-epoch.

torchtune 0.6.1's recipes save once per epoch, but their recipe state already carries the
data loader's position (a ``StatefulDataLoader``). So the one place we need is the data
loader: between two batches of different optimizer steps the model, optimizer and loader
are consistent, and a save there resumes exactly. The recipe's loader is wrapped in a
proxy that, at each step boundary, asks every rank (one tiny all-reduce) whether any was
told to stop, counts the step's tokens, and saves when asked to.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any, Iterator

from kubetune import env
from kubetune.errors import EXIT_TRANSIENT
from trainer import resume

log = logging.getLogger("trainer")


class StopRequested(Exception):
    """Raised inside the recipe once a resumable checkpoint is saved after SIGTERM."""

    exit_code = EXIT_TRANSIENT


class Guard:
    """One per recipe process; settings come from the merged config's ``kubetune`` section."""

    def __init__(self, settings: dict, output_dir: str) -> None:
        self.output_dir = Path(output_dir)
        self.stop_file = os.environ.get(env.STOP_FILE)
        self.save_every = int(settings.get("save_every_n_steps") or 0)
        self.fingerprint = str(settings.get("fingerprint") or "")
        self.resume_offset = int(settings.get("resume_steps_in_epoch") or 0)
        self.signalled = False
        self.stop_pending = False
        self.steps_in_epoch = 0
        self.forced_reason: str | None = None
        self.rank = int(os.environ.get("RANK", "0"))

    def install_signal_handler(self) -> None:
        def on_term(signum, frame) -> None:
            self.signalled = True

        signal.signal(signal.SIGTERM, on_term)

    def stop_asked_here(self) -> bool:
        return self.signalled or bool(self.stop_file and os.path.exists(self.stop_file))

    def agree(self, recipe: Any, stop: bool, tokens: int) -> tuple[bool, int]:
        """All ranks learn whether any must stop, and the step's total token count."""
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return stop, tokens
        device = getattr(recipe, "_device", torch.device("cpu"))
        both = torch.tensor([1.0 if stop else 0.0, float(tokens)], device=device)
        dist.all_reduce(both)
        return bool(both[0].item() > 0), int(both[1].item())

    # -- saves ---------------------------------------------------------------------------

    def save_now(self, recipe: Any, reason: str) -> None:
        """Save a resumable checkpoint at the current step boundary (all ranks call this)."""
        epoch = recipe.epochs_run
        total = recipe.total_epochs
        self.forced_reason = reason
        try:
            if not hasattr(recipe, "_checkpoint_client"):
                # The recipe keeps optimizer and loader state only for a non-final epoch.
                recipe.total_epochs = max(total, epoch + 2)
                try:
                    recipe.save_checkpoint(epoch=epoch)
                finally:
                    recipe.total_epochs = total
            else:
                from torchtune.training.checkpointing._checkpoint_client import TrainingProgress

                optimizer = (recipe._optim_ckpt_wrapper if getattr(recipe, "_optimizer_in_bwd",
                                                                   False) else recipe._optimizer)
                recipe._checkpoint_client.save_checkpoint(
                    model=recipe._model, optimizer=optimizer,
                    training_progress=TrainingProgress(
                        seed=recipe.seed, epochs_run=epoch, total_epochs=max(total, epoch + 2),
                        max_steps_per_epoch=recipe.max_steps_per_epoch,
                        dataloader_state_dict=recipe._dataloader.state_dict()),
                    epoch=epoch)
        finally:
            self.forced_reason = None

    def after_save(self, recipe: Any | None, epochs_run: int, epoch: int,
                   intermediate: bool) -> None:
        """Called after every checkpoint save: record it if a restart can resume from it."""
        if self.rank != 0 or not intermediate:
            return
        reason = self.forced_reason or "epoch"
        steps = self.steps_in_epoch if self.forced_reason else 0
        adapter = recipe is not None and hasattr(recipe, "_lora_rank")
        global_step = getattr(recipe, "global_step", 0) if recipe is not None else 0
        resume.write_record(self.output_dir, resume.ResumeRecord(
            fingerprint=self.fingerprint, epochs_run=epochs_run, steps_in_epoch=steps,
            global_step=global_step, epoch_dir=f"epoch_{epoch}", adapter=adapter,
            reason=reason))
        log.info("resumable checkpoint: epoch_%d after %d epoch(s) + %d step(s) (%s)",
                 epoch, epochs_run, steps, reason)

    # -- resume --------------------------------------------------------------------------

    def after_setup(self, recipe: Any) -> None:
        """Wrap the loader; on a mid-epoch resume, move step count and LR schedule on."""
        recipe._dataloader = GuardedLoader(recipe._dataloader, recipe, self)
        if self.resume_offset and recipe._resume_from_checkpoint:
            recipe.global_step += self.resume_offset
            scheduler = getattr(recipe, "_lr_scheduler", None)
            for _ in range(self.resume_offset if scheduler is not None else 0):
                scheduler.step()
            if self.rank == 0:
                log.info("resumed mid-epoch: epoch %d, step %d of it (global step %d)",
                         recipe.epochs_run, self.resume_offset, recipe.global_step)
        elif not recipe._resume_from_checkpoint:
            self.resume_offset = 0


class GuardedLoader:
    """The recipe's data loader, with a check at every optimizer-step boundary."""

    def __init__(self, loader: Any, recipe: Any, guard: Guard) -> None:
        self._loader = loader
        self._recipe = recipe
        self._guard = guard

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Iterator:
        recipe, guard = self._recipe, self._guard
        if guard.stop_pending:
            # Asked to stop during the last step of an epoch: the epoch's own save is the
            # resumable checkpoint.
            raise StopRequested()
        accum = max(1, int(getattr(recipe, "_gradient_accumulation_steps", 1)))
        offset, guard.resume_offset = guard.resume_offset, 0
        budget = None
        if recipe.max_steps_per_epoch is not None:
            budget = max(0, recipe.max_steps_per_epoch - offset) * accum
        guard.steps_in_epoch = offset
        logger = getattr(recipe, "_metric_logger", None)
        if hasattr(logger, "set_epoch"):
            logger.set_epoch(recipe.epochs_run)
        ignore = getattr(getattr(recipe, "_loss_fn", None), "ignore_index", -100)
        batches = iter(self._loader)
        seen, step_tokens = 0, 0
        while True:
            if seen and seen % accum == 0:  # the recipe finished an optimizer step
                guard.steps_in_epoch = offset + seen // accum
                if guard.stop_pending:
                    guard.save_now(recipe, "signal")
                    raise StopRequested()
                if guard.save_every and recipe.global_step % guard.save_every == 0:
                    guard.save_now(recipe, "step")
            if budget is not None and seen >= budget:
                return
            try:
                batch = next(batches)
            except StopIteration:
                return
            seen += 1
            labels = batch.get("labels") if isinstance(batch, dict) else None
            if labels is not None:
                step_tokens += int((labels != ignore).sum())
            if seen % accum == 0:
                stop, tokens = guard.agree(recipe, guard.stop_asked_here(), step_tokens)
                guard.stop_pending = guard.stop_pending or stop
                step_tokens = 0
                if hasattr(logger, "note_step_tokens"):
                    logger.note_step_tokens(tokens)
            yield batch
