"""Which saved checkpoint an export takes: ``last`` (the one the completion marker names,
the end of the run) or ``best`` (the saved checkpoint with the lowest validation loss, as
the validation record says)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from kubetune import env
from kubetune.errors import BadInputError
from kubetune.workspace import VALIDATION_RECORD_NAME, validation_record
from kubetune.workspace.trainer_output import CompletionMarker

log = logging.getLogger("exporter")

CHOICES = ("last", "best")
DEFAULT = "last"


@dataclass(frozen=True)
class ChosenCheckpoint:
    name: str  # the checkpoint directory, relative to output_dir
    by: str  # one of CHOICES
    val_loss: float | None = None  # its validation loss, where the run measured one
    step: int | None = None  # the optimizer step it was saved at, where recorded


def choose(output_dir: Path, marker: CompletionMarker, choice: str = DEFAULT
           ) -> ChosenCheckpoint:
    """The checkpoint to export; a one-line error for ``best`` on a run without validation."""
    if choice not in CHOICES:
        raise BadInputError(f"{env.EXPORT_CHECKPOINT} {choice!r} is not one of "
                            f"{', '.join(CHOICES)}")
    record = validation_record.read(output_dir)
    if choice == "last":
        entry = (record.checkpoints.get(marker.checkpoint) if record else None) or {}
        return ChosenCheckpoint(marker.checkpoint, "last", _loss(entry), entry.get("step"))
    export_last = f"export the last checkpoint ({env.EXPORT_CHECKPOINT}=last)"
    fallback = (f"{export_last}, or train with a held-out set (a validation or test split, "
                "or KUBETUNE_VAL_FRACTION)")
    if record is None:
        raise BadInputError(f"--checkpoint best needs a run with validation, but {output_dir} "
                            f"has no {VALIDATION_RECORD_NAME} (no data was held out): "
                            + fallback)
    best = record.best_checkpoint
    if best is None:
        raise BadInputError(f"--checkpoint best: no saved checkpoint in {output_dir} has a "
                            f"validation loss ({VALIDATION_RECORD_NAME} records none): "
                            + fallback)
    if not (Path(output_dir) / best).is_dir():
        raise BadInputError(f"--checkpoint best: the checkpoint with the lowest validation loss, "
                            f"{Path(output_dir) / best}, is missing: re-run the trainer, or "
                            f"{export_last}")
    entry = record.checkpoints[best]
    chosen = ChosenCheckpoint(best, "best", _loss(entry), entry.get("step"))
    measured = sum(1 for name in record.checkpoints if record.checkpoint_val_loss(name)
                   is not None)
    log.info("exporting %s: the lowest validation loss (%.4f%s) of %d saved checkpoint%s "
             "(the last, %s: %s)", best, chosen.val_loss,
             f" at step {chosen.step}" if chosen.step is not None else "", measured,
             "" if measured == 1 else "s", marker.checkpoint,
             _fmt(record.checkpoint_val_loss(marker.checkpoint)))
    return chosen


def _loss(entry: dict) -> float | None:
    value = entry.get("val_loss")
    return float(value) if isinstance(value, (int, float)) else None


def _fmt(value: float | None) -> str:
    return "no validation loss" if value is None else f"{value:.4f}"
