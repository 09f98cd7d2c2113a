"""The held-out record (``kubetune-validation.json`` in ``output/``): where the held-out set
came from, each evaluation's loss, each saved epoch checkpoint's loss, and an early stop.

Written atomically by the recipe process's rank 0 after every evaluation and every epoch
save; the launcher (summary, early-stop reason), the run report, the model card and the
exporter (``--checkpoint best``) read it through this module only. A resumed run reads it
back instead of measuring the base again, cut back to its checkpoint's step.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kubetune.atomic_write import write_atomic
from kubetune.workspace import VALIDATION_RECORD_NAME


@dataclass
class ValidationRecord:
    source: str | None = None  # "split" | "fraction" | "config"
    split: str | None = None  # the held-out split's name
    train_split: str | None = None
    fraction: float | None = None
    rows: int = 0
    tokens: int = 0  # labelled held-out tokens each evaluation scores
    every_n_steps: int = 0
    # {"step", "epoch", "val_loss", "val_tokens"}, in step order
    evaluations: list[dict] = field(default_factory=list)
    # "epoch_N" -> {"step", "val_loss"}: each saved epoch checkpoint's held-out loss
    checkpoints: dict[str, dict] = field(default_factory=dict)
    # {"patience", "step", "best_step", "best_val_loss"} when the run stopped early
    early_stop: dict | None = None

    @property
    def base(self) -> dict | None:
        """The base model's evaluation (step 0)."""
        return next((e for e in self.evaluations if e["step"] == 0), None)

    @property
    def last(self) -> dict | None:
        return self.evaluations[-1] if self.evaluations else None

    @property
    def best(self) -> dict | None:
        """The evaluation with the lowest val_loss (the earliest of equals)."""
        scored = [e for e in self.evaluations if e.get("val_loss") is not None]
        return min(scored, key=lambda e: e["val_loss"]) if scored else None

    @property
    def best_checkpoint(self) -> str | None:
        """The saved checkpoint directory (``epoch_N``) with the lowest val_loss."""
        scored = [(v["val_loss"], v["step"], name) for name, v in self.checkpoints.items()
                  if v.get("val_loss") is not None]
        return min(scored)[2] if scored else None

    def checkpoint_at(self, step: int) -> str | None:
        """The saved epoch checkpoint of ``step``, if one was saved there."""
        return next((name for name, v in self.checkpoints.items() if v["step"] == step), None)

    def evaluation_at(self, step: int) -> dict | None:
        return next((e for e in self.evaluations if e["step"] == step), None)

    def cut_to(self, step: int) -> None:
        """Forget what came after ``step`` (a resume from there trains it again)."""
        self.evaluations = [e for e in self.evaluations if e["step"] <= step]
        self.checkpoints = {n: v for n, v in self.checkpoints.items() if v["step"] <= step}
        self.early_stop = None

    def encode(self) -> str:
        return json.dumps(asdict(self), indent=2)


def path(output_dir: Path | str) -> Path:
    return Path(output_dir) / VALIDATION_RECORD_NAME


def read(output_dir: Path | str) -> ValidationRecord | None:
    """The record, or None where the run had no held-out set (or wrote none yet)."""
    try:
        data = json.loads(path(output_dir).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    known = ValidationRecord.__dataclass_fields__
    return ValidationRecord(**{k: v for k, v in data.items() if k in known})


def write(output_dir: Path | str, record: ValidationRecord) -> None:
    write_atomic(path(output_dir), record.encode())


def remove(output_dir: Path | str) -> None:
    """A fresh run's start: an earlier run's record never describes this one."""
    path(output_dir).unlink(missing_ok=True)
