"""What the launcher records once the recipe has ended: ``summary.json`` and the run report
however it ended, and for a completed run the adapter configs named, the resume record
cleared and the completion marker, written last."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from kubetune.atomic_write import write_atomic
from kubetune.workspace import COMPLETION_MARKER_NAME, SUMMARY_NAME, TRAINER_CONFIG_NAME
from kubetune.workspace import validation_record
from kubetune.workspace.model_files import original_repo_id
from kubetune.workspace.trainer_output import CompletionMarker
from kubetune.trainer.checkpointing import resume
from kubetune.trainer.planning.plan import RunPlan
from kubetune.trainer.launcher import run_objective
from kubetune.trainer.launcher.supervision import RecipeRun
from kubetune.trainer.metric_logging import run_report, train_progress
from kubetune.trainer.metric_logging.summary import summarize
from kubetune.trainer.metric_logging.validation_numbers import loss_change

log = logging.getLogger("trainer")


def record_summary(plan_: RunPlan, ran: RecipeRun, stopped: bool) -> dict:
    """summary.json and the run report, however the run ended (rank 0's node only)."""
    if stopped:
        reason = "stopped by signal" + (" (grace period over)" if ran.killed else "")
    elif ran.code == 0:
        reason = early_stop_reason(plan_.output_dir) or "completed"
    else:
        reason = f"failed (exit {ran.code})"
    summary = summarize(plan_.output_dir, ran.wall_s, reason, plan_.checkpoint.architecture.shape,
                        str(plan_.cfg.device), plan_.topology.world_size,
                        final_epoch_dir(plan_), plan_.method, plan_.cfg)
    summary["objective"] = run_objective.section(plan_)  # the exporter's manifest and card
    write_atomic(plan_.output_dir / SUMMARY_NAME, json.dumps(summary, indent=2))
    run_report.at_end(plan_.output_dir, summary)
    return summary


def finish(plan_: RunPlan, summary: dict) -> None:
    """A completed run: adapter configs named, resume record cleared, marker written last."""
    output_dir = plan_.output_dir
    fix_adapter_configs(output_dir, plan_.checkpoint.model_dir)
    resume.clear(output_dir)
    marker = CompletionMarker(checkpoint=summary["checkpoint"], method=plan_.method,
                              config=TRAINER_CONFIG_NAME, steps=summary["steps"],
                              fingerprint=plan_.fingerprint,
                              finished_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    # Written last: the exporter trusts only an output_dir that has this marker.
    write_atomic(output_dir / COMPLETION_MARKER_NAME, marker.encode())
    train_progress.report_finished(summary)
    # Rounded for people (summary.json keeps every digit).
    loss = lambda value: "?" if value is None else f"{value:.4f}"  # noqa: E731
    val = loss_change(summary.get("validation"))
    log.info("done: %s steps in %.1f s, loss %s -> %s, %s%s tokens/s, checkpoint %s",
             summary["steps"], summary["wall_time_s"], loss(summary["first_loss"]),
             loss(summary["last_loss"]), f"val loss {val}, " if val else "",
             f"{summary['tokens_per_second']:.0f}" if summary["tokens_per_second"] else "?",
             output_dir / str(summary["checkpoint"]))


def fix_adapter_configs(output_dir: Path, model_dir: Path) -> None:
    """torchtune writes ``base_model_name_or_path: null`` without original_repo_id.json."""
    name = original_repo_id(model_dir)
    for path in output_dir.glob("epoch_*/adapter_config.json"):
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not config.get("base_model_name_or_path"):
            config["base_model_name_or_path"] = name or str(model_dir)
            write_atomic(path, json.dumps(config, indent=2))


def early_stop_reason(output_dir: Path) -> str | None:
    """Why a run that stopped early (``kubetune-validation.json``) ended, or None."""
    record = validation_record.read(output_dir)
    stop = record.early_stop if record is not None else None
    if not stop:
        return None
    return (f"early stop: no improvement in {stop['patience']} evaluations (best val_loss "
            f"{stop['best_val_loss']:.4f} at step {stop['best_step']})")


def final_epoch_dir(plan_: RunPlan) -> str | None:
    """This run's last epoch: the newest epoch_N could be a longer earlier run's leftover;
    a run that stopped early ended with the epoch it stopped in."""
    record = validation_record.read(plan_.output_dir)
    if record is not None and record.early_stop:
        stopped = record.checkpoint_at(int(record.early_stop["step"]))
        if stopped is not None and (plan_.output_dir / stopped).is_dir():
            return stopped
    final = f"epoch_{int(plan_.cfg.get('epochs') or 1) - 1}"
    if (plan_.output_dir / final).is_dir():
        return final
    return latest_epoch_dir(plan_.output_dir)


def latest_epoch_dir(output_dir: Path) -> str | None:
    epochs = sorted((p for p in output_dir.glob("epoch_*") if p.name[6:].isdigit()),
                    key=lambda p: int(p.name[6:]))
    return epochs[-1].name if epochs else None
