"""Run a planned training: write the merged config, run torchtune's recipe (through
``kubetune.trainer.recipe_process.bootstrap``) as a child, turn SIGTERM into a resumable stop, and record the
outcome (``summary.json``, then the completion marker, last).

This module is the flow; each phase has a room in ``kubetune.trainer.launcher``: the child's
environment (``child_env``), running and supervising it (``supervision``), judging how it
ended (``outcome``, from the failure record a failing process leaves), and what a run
leaves behind (``finish``)."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from omegaconf import OmegaConf

from kubetune import file_lock
from kubetune.atomic_write import write_atomic
from kubetune.errors import KubetuneError, TransientError
from kubetune.workspace import (ANSWERS_NAME, COMPLETION_MARKER_NAME, METRICS_NAME, SUMMARY_NAME,
                                TRAINER_CONFIG_NAME, TRAINER_LOCK_NAME, TRAINING_SAMPLES_NAME)
from kubetune.workspace import validation_record
from kubetune.workspace.trainer_output import completed_fingerprint, read_marker
from kubetune.trainer.checkpointing import resume
from kubetune.trainer.checkpointing.checkpoint_model import SPECIAL_TOKENS_FILE
from kubetune.trainer.planning.plan import RunPlan
from kubetune.trainer.config.saved_config import has_credentials, without_credentials
from kubetune.trainer.config.validate import check_volume, check_writable
from kubetune.trainer.launcher import outcome
from kubetune.trainer.launcher.child_env import child_env
from kubetune.trainer.launcher.finish import finish, record_summary
from kubetune.trainer.launcher.previous_run import set_aside
from kubetune.trainer.launcher.supervision import run_recipe

log = logging.getLogger("trainer")


def _print_dry_run(plan_: RunPlan, command: list[str]) -> None:
    print(f"recipe: {plan_.request.recipe} ({plan_.recipe_path})")
    print(f"method: {plan_.method}; topology: {plan_.topology.kind} "
          f"({plan_.topology.nnodes} node(s) x {plan_.topology.nproc_per_node} process(es))")
    for note in plan_.notes:
        print(f"note: {note}")
    print("config:")
    print(OmegaConf.to_yaml(plan_.cfg), end="")
    print("command: " + " ".join(command))


def _finished_at(output_dir: Path) -> str:
    try:
        return read_marker(output_dir).finished_at or "earlier"
    except KubetuneError:
        return "earlier"


def _already_complete(plan_: RunPlan) -> bool:
    return completed_fingerprint(plan_.output_dir) == plan_.fingerprint


def run(plan_: RunPlan, dry_run: bool = False) -> int:
    """Run the planned training (or print what would run): 0 when it completed or was
    already complete; a failure or a stop raises its one-line KubetuneError."""
    output_dir = plan_.output_dir
    config_path = output_dir / TRAINER_CONFIG_NAME
    command = plan_.command(config_path)
    if dry_run:
        _print_dry_run(plan_, command)
        return 0
    for note in plan_.notes:
        log.info(note)
    check_writable(output_dir)
    with _output_held(plan_):
        return _run_holding_output(plan_, config_path, command)


@contextlib.contextmanager
def _output_held(plan_: RunPlan) -> Iterator[None]:
    """The one trainer on ``output_dir`` (as an initializer holds its output): a second
    one, started by hand, by a second `kubetune local` or by a restarted pod while the old
    one still saves, would log every step twice and write over the first's checkpoints.
    It fails at once, touching nothing; a restart (exit 75) succeeds once the first is gone.
    Rank 0's node holds it for all: every node of one run shares the directory."""
    if not plan_.is_primary_node:
        yield
        return
    try:
        with file_lock.hold(plan_.output_dir / TRAINER_LOCK_NAME, wait=False):
            yield
    except file_lock.LockHeld as held:
        raise TransientError(f"output_dir {plan_.output_dir} is in use by another trainer "
                             f"({held.holder}): wait for it to finish, or give this run "
                             "another output_dir") from None


def _run_holding_output(plan_: RunPlan, config_path: Path, command: list[str]) -> int:
    output_dir = plan_.output_dir
    primary = plan_.is_primary_node
    if _already_complete(plan_):
        # Every node decides the same from the shared volume: a node that went on alone
        # would wait for the others at the rendezvous forever.
        log.info("%s already holds this run's completed training (same config and inputs, "
                 "finished %s): nothing to do, on to the export", output_dir,
                 _finished_at(output_dir))
        return 0
    if primary:
        if plan_.resumed_from is None:
            set_aside(plan_)  # another run's output: never beside this one's
        (output_dir / COMPLETION_MARKER_NAME).unlink(missing_ok=True)
        (output_dir / SUMMARY_NAME).unlink(missing_ok=True)
        # This run records its own (a text-completion run none): never an earlier run's.
        (output_dir / TRAINING_SAMPLES_NAME).unlink(missing_ok=True)
        if plan_.resumed_from is None:
            (output_dir / METRICS_NAME).unlink(missing_ok=True)
            validation_record.remove(output_dir)
            # An earlier run's answers never stand beside this run's report.
            (output_dir / ANSWERS_NAME).unlink(missing_ok=True)
            resume.clear(output_dir)
        else:
            # Steps after the checkpoint (a kill -9 leaves them) are trained and logged again.
            resume.trim_metrics(output_dir / METRICS_NAME, plan_.resumed_from.global_step)
    special = plan_.checkpoint.tokenizer.special_tokens
    if special:
        # torchtune reads special-token ids from a tokenizer.json's added_tokens.
        write_atomic(output_dir / SPECIAL_TOKENS_FILE, json.dumps(
            {"added_tokens": [{"id": i, "content": t} for t, i in special.items()]}))
    saved = without_credentials(plan_.cfg)
    write_atomic(config_path, OmegaConf.to_yaml(saved))
    private = None
    if has_credentials(plan_.cfg):
        # URL credentials in an override: the recipe reads them from a copy only this
        # process's user can read, gone when the recipe ends; the volume keeps the masked one.
        private = Path(tempfile.mkdtemp(prefix="kubetune-recipe-config-"))
        write_atomic(private / TRAINER_CONFIG_NAME, OmegaConf.to_yaml(plan_.cfg))
        command = plan_.command(private / TRAINER_CONFIG_NAME)
    try:
        return _launch(plan_, command)
    finally:
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)


def _launch(plan_: RunPlan, command: list[str]) -> int:
    """The phases of a launch: run the recipe, judge how it ended, record it, and either
    raise the one-line failure or write the completion marker."""
    ran = run_recipe(command, child_env(plan_), plan_.grace_period_s)
    stopped = outcome.was_stopped(plan_, ran)
    if ran.code != 0 and not stopped:
        # The whole tail: torch's zip writer reports the full disk as a RuntimeError whose
        # chained OSError (Errno 28) stands lines above the last exception line.
        check_volume("\n".join(ran.tail), plan_.output_dir)  # before writing anything more
    summary = record_summary(plan_, ran, stopped) if plan_.is_primary_node else None
    if stopped:
        outcome.raise_stopped(plan_)
    if ran.code != 0:
        outcome.raise_failed(plan_, ran)
    if summary is not None:
        finish(plan_, summary)
    return 0
