"""Find the checkpoint the trainer finished, by its completion marker."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kubetune.errors import BadInputError
from kubetune.workspace import COMPLETION_MARKER_NAME


@dataclass
class TrainingOutput:
    output_dir: Path
    checkpoint_dir: Path
    marker: dict

    @property
    def is_peft(self) -> bool:
        return (self.checkpoint_dir / "adapter_model.safetensors").is_file()

    def summary(self) -> dict:
        try:
            return json.loads((self.output_dir / "summary.json").read_text())
        except (OSError, ValueError):
            return {}


def locate(output_dir: Path) -> TrainingOutput:
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        raise BadInputError(f"no training output at {output_dir}: run the trainer first")
    marker_path = output_dir / COMPLETION_MARKER_NAME
    if not marker_path.is_file():
        raise BadInputError(f"{output_dir} has no {COMPLETION_MARKER_NAME}: the training run "
                            "did not finish (incomplete epoch); nothing to export")
    try:
        marker = json.loads(marker_path.read_text())
        checkpoint_dir = output_dir / marker["checkpoint"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadInputError(f"{marker_path} is unreadable: {exc}") from None
    if not checkpoint_dir.is_dir():
        raise BadInputError(f"the completed checkpoint {checkpoint_dir} is missing")
    return TrainingOutput(output_dir=output_dir, checkpoint_dir=checkpoint_dir, marker=marker)
