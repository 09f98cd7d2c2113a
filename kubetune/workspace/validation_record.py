"""The held-out record (``kubetune-validation.json`` in ``output/``): where the held-out set
came from, each evaluation's loss (step 0 is the base model), each saved epoch checkpoint's
loss, and why the run stopped early if it did.

Written atomically by the recipe process's rank 0 after every evaluation and every epoch
save; the launcher (summary, early-stop reason), the run report, the model card and the
exporter (``--checkpoint best``) read it through this module only. A resumed run reads it
back instead of measuring the base again, cut back to its checkpoint's step.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kubetune.atomic_write import write_atomic
from kubetune.workspace import VALIDATION_RECORD_NAME


@dataclass
class ValidationRecord:
    source: str | None = None  # "split" | "fraction" | "config"
    split: str | None = None  # the held-out split's name
    train_split: str | None = None  # the split trained on
    fraction: float | None = None  # the held-out fraction of the training split
    rows: int | None = None  # held-out rows
    tokens: int | None = None  # labelled held-out tokens each evaluation scores
    every_n_steps: int | None = None
    # [{"step", "epoch", "val_loss", "val_tokens"}], in the order measured
    evaluations: list[dict] = field(default_factory=list)
    # "epoch_N" -> {"step", "val_loss"}: each saved epoch checkpoint's held-out loss
    checkpoints: dict[str, dict] = field(default_factory=dict)
    # None, or {"patience", "step", "best_step", "best_val_loss"} when the run stopped early
    early_stop: dict | None = None

    def by_step(self) -> list[dict]:
        """One evaluation per step (a resumed run may measure a step again: the last
        measurement wins), in step order."""
        found: dict[int, dict] = {}
        for evaluation in self.evaluations:
            if isinstance(evaluation, dict) and _number(evaluation.get("val_loss")) is not None:
                found[int(evaluation.get("step", 0))] = evaluation
        return [found[step] for step in sorted(found)]

    @property
    def base(self) -> dict | None:
        """The base model's evaluation (step 0), if the run measured it."""
        return next((e for e in self.by_step() if int(e["step"]) == 0), None)

    @property
    def last(self) -> dict | None:
        evaluations = self.by_step()
        return evaluations[-1] if evaluations else None

    @property
    def best(self) -> dict | None:
        """The evaluation with the lowest val_loss; the earliest of equals (the first time
        the run got there)."""
        evaluations = self.by_step()
        return min(evaluations, key=lambda e: float(e["val_loss"])) if evaluations else None

    @property
    def best_checkpoint(self) -> str | None:
        """The saved checkpoint directory with the lowest val loss (the earliest of
        equals), or None when no saved checkpoint has one."""
        measured = [(float(v["val_loss"]), int(v.get("step") or 0), name)
                    for name, v in self.checkpoints.items()
                    if isinstance(v, dict) and _number(v.get("val_loss")) is not None]
        return min(measured)[2] if measured else None

    def checkpoint_val_loss(self, name: str) -> float | None:
        entry = self.checkpoints.get(name)
        return _number(entry.get("val_loss")) if isinstance(entry, dict) else None

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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def encode(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: dict) -> "ValidationRecord":
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        record = cls(**known)
        record.evaluations = list(record.evaluations or [])
        record.checkpoints = dict(record.checkpoints or {})
        return record


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def path(output_dir: Path | str) -> Path:
    return Path(output_dir) / VALIDATION_RECORD_NAME


def read(output_dir: Path | str) -> ValidationRecord | None:
    """The run's record; None when it has none (no held-out set, or none written yet) or
    it is unreadable."""
    try:
        data = json.loads(path(output_dir).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    try:
        return ValidationRecord.from_dict(data)
    except (TypeError, ValueError):
        return None


def write(output_dir: Path | str, record: ValidationRecord) -> Path:
    """Replace the record whole: a reader never sees half of one."""
    target = path(output_dir)
    write_atomic(target, record.encode())
    return target


def remove(output_dir: Path | str) -> None:
    """A fresh run's start: an earlier run's record never describes this one."""
    path(output_dir).unlink(missing_ok=True)
