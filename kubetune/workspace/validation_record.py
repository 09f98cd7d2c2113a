"""The validation record, ``<output_dir>/kubetune-validation.json``: every held-out loss the
run measured (step 0 is the base model), the loss of each saved checkpoint, and why the run
stopped early if it did.

Rank 0 writes it (atomically) after every evaluation and every save; the launcher, the
summary, the run report, the model card and the exporter read it here and only here.
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
    tokens: int | None = None  # labelled held-out tokens (one evaluation's)
    every_n_steps: int | None = None
    # [{"step", "epoch", "val_loss", "val_tokens"}], in the order measured
    evaluations: list[dict] = field(default_factory=list)
    # checkpoint directory (relative to output_dir) -> {"step", "val_loss"}
    checkpoints: dict[str, dict] = field(default_factory=dict)
    # None, or {"patience", "step", "best_step", "best_val_loss"}
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

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


def path(output_dir: Path) -> Path:
    return Path(output_dir) / VALIDATION_RECORD_NAME


def read(output_dir: Path) -> ValidationRecord | None:
    """The run's record; None when it has none (no held-out set) or it is unreadable."""
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


def write(output_dir: Path, record: ValidationRecord) -> Path:
    """Replace the record whole: a reader never sees half of one."""
    target = path(output_dir)
    write_atomic(target, json.dumps(record.to_dict(), indent=2) + "\n")
    return target
