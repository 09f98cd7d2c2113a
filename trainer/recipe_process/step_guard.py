"""Step-level control around an unmodified torchtune recipe: stop on SIGTERM with a
resumable checkpoint, periodic step-level saves, and resuming exactly where a save was.

Between two batches of different optimizer steps the model, optimizer and data position
are consistent, and a save there resumes exactly. The recipe's loader is wrapped in a
proxy that, at each step boundary, asks every rank (one tiny collective) whether any was
told to stop, counts the step's tokens, digests what it trained on, stops the run at a
non-finite loss (``run_sanity``), and saves when asked.

Resuming exactly, around what torchtune 0.6.1 does not restore:

- data: the recipes build a ``StatefulDataLoader`` and are handed its saved state but never
  load it; each epoch they call ``sampler.set_epoch(epoch)`` (a ``DistributedSampler``
  seeded per epoch) and iterate from the first batch. The first epoch after a resume
  tells the sampler, through its public ``load_state_dict``, to skip exactly the samples
  the checkpoint's steps consumed (steps x accumulation x batch size, per rank), so the
  same samples follow in the same order; a sampler without that hook gets the consumed
  batches drawn and dropped instead.
- ``global_step``: the recipes restore it only when ``max_steps_per_epoch`` cuts the epoch
  short, and then as whole epochs; it is set from the record, exactly.
- the LR scheduler: built at torchtune's (wrong) step, it is stepped on to the record's.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import time
import warnings
from pathlib import Path
from typing import Any, Iterator

from kubetune.errors import EXIT_TRANSIENT
from kubetune.trainer.checkpointing import resume
from kubetune.trainer.recipe_process import run_sanity
from kubetune.trainer.checkpointing.checkpoint_store import CheckpointStore
from kubetune.trainer.request import passed_env

log = logging.getLogger("trainer")


class StopRequested(Exception):
    """Raised inside the recipe once a resumable checkpoint is saved after SIGTERM."""

    exit_code = EXIT_TRANSIENT


class EarlyStopped(StopRequested):
    """Raised at the start of the epoch after an early stop's final save (``held_out``):
    the run is complete; the recipe's cleanup is left to the catcher."""

    exit_code = 0

    def __init__(self, recipe: Any) -> None:
        super().__init__()
        self.recipe = recipe


def batch_parts(batch: Any) -> tuple[Any, Any]:
    """A micro-batch's token ids and labels: an SFT batch's ``tokens`` and ``labels``; a
    DPO batch (``padded_collate_dpo``) is the tuple (input ids, labels) of its chosen and
    rejected rows stacked."""
    if isinstance(batch, dict):
        return batch.get("tokens"), batch.get("labels")
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    return None, None


def batch_digest(batch: Any, hasher: "hashlib._Hash") -> None:
    """Feed what a micro-batch trains on (its token ids) into ``hasher``."""
    tokens = batch_parts(batch)[0]
    if tokens is not None:
        hasher.update(tokens.detach().cpu().contiguous().numpy().tobytes())


class Guard:
    """One per recipe process; settings come from the merged config's ``kubetune`` section."""

    def __init__(self, settings: dict, output_dir: str) -> None:
        self.output_dir = Path(output_dir)
        self.settings = settings
        self.stop_file = passed_env.stop_file()
        self.save_every = int(settings.get("save_every_n_steps") or 0)
        self.fingerprint = str(settings.get("fingerprint") or "")
        self.asked_sizes = settings.get("asked_sizes")  # for run_sanity's no-step line
        self.resume_offset = int(settings.get("resume_steps_in_epoch") or 0)
        resume_step = settings.get("resume_global_step")
        self.resume_global_step = int(resume_step) if resume_step is not None else None
        self.signalled = False
        self.stop_pending = False
        self.steps_in_epoch = 0
        self.first_step = 0  # the global step this process started from
        self.step_tokens: int | None = None  # the last step's trainable tokens, all ranks
        self.forced_reason: str | None = None
        self._loss_checked: tuple | None = None
        self.rank = passed_env.rank()
        self.test_step_pause = passed_env.test_step_pause()
        self.store = CheckpointStore(self.output_dir) if self.rank == 0 else None
        # The held-out set's hooks (``recipe_process.held_out``), set after the recipe's
        # setup where the run validates; ``early_stopped`` once it has stopped the run.
        self.held_out: Any = None
        self.early_stopped = False

    def install_signal_handler(self) -> None:
        def on_term(signum, frame) -> None:
            self.signalled = True

        signal.signal(signal.SIGTERM, on_term)

    def stop_asked_here(self) -> bool:
        return self.signalled or bool(self.stop_file and os.path.exists(self.stop_file))

    def agree(self, recipe: Any, stop: bool, tokens: int, digest: bytes
              ) -> tuple[bool, int, str]:
        """All ranks learn whether any must stop, the step's total token count, and one
        digest of every rank's batches (in rank order)."""
        import torch
        import torch.distributed as dist

        mine = int.from_bytes(digest[:7], "big")  # fits an int64 on every backend
        if not (dist.is_available() and dist.is_initialized()):
            return stop, tokens, digest[:8].hex()
        device = getattr(recipe, "_device", torch.device("cpu"))
        local = torch.tensor([int(stop), tokens, mine], dtype=torch.int64, device=device)
        gathered = [torch.zeros_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, local)
        rows = [g.tolist() for g in gathered]
        combined = hashlib.blake2b(str([r[2] for r in rows]).encode(), digest_size=8)
        return any(r[0] for r in rows), sum(r[1] for r in rows), combined.hexdigest()

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

    def before_save(self, checkpointer: Any) -> Path | None:
        """Point torchtune's checkpointer at a fresh staging directory (rank 0, which
        writes); returns the directory to restore afterwards."""
        if self.store is None or checkpointer is None:
            return None
        original = checkpointer._output_dir
        checkpointer._output_dir = self.store.begin()
        return original

    def after_save(self, recipe: Any | None, checkpointer: Any, original_dir: Path | None,
                   epochs_run: int, epoch: int, intermediate: bool) -> None:
        """Called after every checkpoint save: commit it; vouch for it if a restart can
        resume from it."""
        if original_dir is None:
            return
        checkpointer._output_dir = original_dir
        # An epoch's own save is also the stop's checkpoint when the stop came in its last step.
        reason = self.forced_reason or ("signal" if self.stop_pending else "epoch")
        steps = self.steps_in_epoch if self.forced_reason else 0
        adapter = recipe is not None and hasattr(recipe, "_lora_rank")
        global_step = getattr(recipe, "global_step", 0) if recipe is not None else 0
        record = resume.ResumeRecord(
            fingerprint=self.fingerprint, epochs_run=epochs_run, steps_in_epoch=steps,
            global_step=global_step, epoch_dir="", adapter=adapter, reason=reason)
        self.store.commit(record, epoch, resumable=intermediate,
                          publish_epoch=self.forced_reason is None)
        if intermediate:
            log.info("resumable checkpoint %s: %d epoch(s) + %d step(s), global step %d (%s)",
                     record.checkpoint, epochs_run, steps, global_step, reason)

    def check_loss(self, recipe: Any) -> None:
        """Stop at the first non-finite loss the recipe logged (rank 0, which logs)."""
        logged = getattr(getattr(recipe, "_metric_logger", None), "last_loss", None)
        if logged is not None and logged != self._loss_checked:
            self._loss_checked = logged
            empty = run_sanity.check_loss(recipe, *logged, first_step=self.first_step,
                                          tokens=self.step_tokens)
            if empty:
                log.warning(empty)

    # -- resume --------------------------------------------------------------------------

    def after_setup(self, recipe: Any) -> None:
        """Wrap the loader; on a resume, set the step count and LR schedule exactly."""
        recipe._dataloader = GuardedLoader(recipe._dataloader, recipe, self)
        if not recipe._resume_from_checkpoint or self.resume_global_step is None:
            self.resume_offset = 0
            self.first_step = int(getattr(recipe, "global_step", 0) or 0)
            return
        recipe.global_step = self.first_step = self.resume_global_step
        scheduler = getattr(recipe, "_lr_scheduler", None)
        if scheduler is not None:
            with warnings.catch_warnings():
                # "step() before optimizer.step()": moving the schedule, not training.
                warnings.simplefilter("ignore", UserWarning)
                for _ in range(recipe.global_step - scheduler.last_epoch):
                    scheduler.step()
        if self.rank == 0:
            log.info("resumed: epoch %d, step %d of it (global step %d)",
                     recipe.epochs_run, self.resume_offset, recipe.global_step)


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

    def _skip_in_sampler(self, batches: int) -> bool:
        """Have the sampler start ``batches`` batches into the epoch; False if it cannot."""
        from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

        sampler = getattr(self._loader, "sampler", None)
        batch_size = getattr(self._loader, "batch_size", None)
        if not isinstance(sampler, StatefulDistributedSampler) or not batch_size:
            return False
        sampler.load_state_dict({"yielded": batches * batch_size})
        return True

    def __iter__(self) -> Iterator:
        recipe, guard = self._recipe, self._guard
        if guard.early_stopped:
            # The early stop's epoch is saved (as the final one): the run is complete.
            raise EarlyStopped(recipe)
        if guard.stop_pending:
            # Asked to stop during the last step of an epoch: the epoch's own save is the
            # resumable checkpoint.
            raise StopRequested()
        accum = max(1, int(getattr(recipe, "_gradient_accumulation_steps", 1)))
        offset, guard.resume_offset = guard.resume_offset, 0
        steps_this_epoch = len(self._loader) // accum
        if recipe.max_steps_per_epoch is not None:
            steps_this_epoch = min(steps_this_epoch, recipe.max_steps_per_epoch)
        # Whole steps only: a trailing micro-batch short of a step would train with no
        # optimizer step and leave its gradients to the next epoch's first step (the
        # out-of-memory fallback's smaller micro-batch can leave one where there was none).
        batches_this_epoch = steps_this_epoch * accum
        budget = max(0, batches_this_epoch - offset * accum)
        guard.steps_in_epoch = offset
        logger = getattr(recipe, "_metric_logger", None)
        if hasattr(logger, "set_epoch"):
            logger.set_epoch(recipe.epochs_run)
        # The base model (step 0), before any step; on a resume, a stop its record decided.
        if guard.held_out is not None and guard.held_out.at_boundary(recipe, epoch_end=False):
            return
        if budget == 0:
            return  # (telling the sampler to skip would carry over into the next epoch)
        skip = 0 if not offset or self._skip_in_sampler(offset * accum) else offset * accum
        batches = iter(self._loader)
        for _ in range(skip):
            next(batches, None)
        seen, step_tokens, hasher = 0, 0, hashlib.blake2b(digest_size=16)
        while True:
            if seen and seen % accum == 0:  # the recipe finished an optimizer step
                if self._after_step(offset + seen // accum, steps_this_epoch):
                    return
            if seen >= budget:
                return
            try:
                batch = next(batches)
            except StopIteration:
                return
            seen += 1
            labels = batch_parts(batch)[1]
            if labels is not None:
                ignore = getattr(getattr(recipe, "_loss_fn", None), "ignore_index", -100)
                step_tokens += int((labels != ignore).sum())
            batch_digest(batch, hasher)
            if seen % accum == 0:
                self._before_step(logger, step_tokens, hasher.digest())
                step_tokens, hasher = 0, hashlib.blake2b(digest_size=16)
            yield batch

    def _after_step(self, steps_in_epoch: int, steps_this_epoch: int) -> bool:
        """At an optimizer-step boundary: the loss checked, the held-out set measured, a
        stop or periodic save made mid-epoch. True: the epoch ends here (an early stop)."""
        recipe, guard = self._recipe, self._guard
        guard.steps_in_epoch = steps_in_epoch
        if guard.test_step_pause:
            time.sleep(guard.test_step_pause)
        guard.check_loss(recipe)  # before any save of this step's weights
        # At the epoch's end the recipe's own save follows (and a pending stop raises at
        # the next epoch's start): no save of ours there.
        mid_epoch = guard.steps_in_epoch < steps_this_epoch
        # Measured before a save (the record holds it when a resume starts here); an early
        # stop ends the epoch here and the recipe's own save follows.
        if guard.held_out is not None and guard.held_out.at_boundary(
                recipe, epoch_end=not mid_epoch):
            return True
        if guard.stop_pending and mid_epoch:
            guard.save_now(recipe, "signal")
            raise StopRequested()
        if guard.save_every and recipe.global_step % guard.save_every == 0 and mid_epoch:
            guard.save_now(recipe, "step")
        return False

    def _before_step(self, logger: Any, step_tokens: int, digest: bytes) -> None:
        """Once a step's micro-batches are drawn, before the recipe trains on them: every
        rank agrees on a stop, the step's tokens and its batches' digest, and the logger
        is told them and the learning rate the step trains with."""
        recipe, guard = self._recipe, self._guard
        stop, tokens, digest = guard.agree(recipe, guard.stop_asked_here(), step_tokens,
                                           digest)
        guard.stop_pending = guard.stop_pending or stop
        guard.step_tokens = tokens
        if hasattr(logger, "note_step_tokens"):
            logger.note_step_tokens(tokens)
        if hasattr(logger, "note_step_digest"):
            logger.note_step_digest(digest)
        if hasattr(logger, "note_step_lr"):
            # Before the step: the rate it trains with (the recipe logs the one the
            # scheduler has moved on to for the next step).
            logger.note_step_lr(run_sanity.current_lr(recipe))
