"""Find the checkpoint the trainer finished, by its completion marker, and check it is whole."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from kubetune.errors import BadInputError
from kubetune.workspace import COMPLETION_MARKER_NAME

_INDEX = "model.safetensors.index.json"


@dataclass
class TrainingOutput:
    output_dir: Path
    checkpoint_dir: Path
    marker: dict

    @property
    def is_peft(self) -> bool:
        return (self.checkpoint_dir / "adapter_model.safetensors").is_file()

    def merged_shards(self) -> list[Path]:
        """The merged model's shards, as the index names them (empty: none were saved)."""
        index = self.checkpoint_dir / _INDEX
        if index.is_file():
            try:
                names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError, AttributeError) as exc:
                raise BadInputError(f"{index} is unreadable ({exc}): the checkpoint is "
                                    "incomplete; re-run the trainer") from None
            missing = [n for n in names if not (self.checkpoint_dir / n).is_file()]
            if missing:
                raise BadInputError(f"{self.checkpoint_dir} lacks shards its index names "
                                    f"({', '.join(missing[:3])}): the checkpoint is incomplete; "
                                    "re-run the trainer")
            return [self.checkpoint_dir / n for n in names]
        return sorted(self.checkpoint_dir.glob("model*.safetensors"))

    def summary(self) -> dict:
        try:
            return json.loads((self.output_dir / "summary.json").read_text())
        except (OSError, ValueError):
            return {}

    def carry_report(self, tree: Path) -> dict[str, str]:
        """Copy the trainer's run report (markdown, curves) into the export tree; returns
        the names copied, by kind."""
        from kubetune.trainer.run_report import CURVES_NAME, REPORT_NAME

        carried = {}
        for kind, name in (("report", REPORT_NAME), ("curves", CURVES_NAME)):
            source = self.output_dir / name
            if source.is_file():
                shutil.copyfile(source, tree / name)
                carried[kind] = name
        return carried

    def config_text(self) -> str | None:
        path = self.output_dir / str(self.marker.get("config") or "")
        return path.read_text() if path.is_file() else None

    def config(self) -> dict:
        """The resolved training config (the trainer's kubetune-config.yaml)."""
        text = self.config_text()
        if not text:
            return {}
        from omegaconf import OmegaConf

        try:
            # Unresolved: interpolations such as ${output_dir} stay as written.
            return OmegaConf.to_container(OmegaConf.create(text), resolve=False) or {}
        except Exception:  # a malformed config only costs the manifest some detail
            return {}


def locate(output_dir: Path) -> TrainingOutput:
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        raise BadInputError(f"no training output at {output_dir}: run the trainer first, or "
                            "set --output-dir / KUBETUNE_OUTPUT_DIR")
    marker_path = output_dir / COMPLETION_MARKER_NAME
    if not marker_path.is_file():
        raise BadInputError(f"{output_dir} has no {COMPLETION_MARKER_NAME}: the training run did "
                            "not finish (incomplete epoch); re-run the trainer, nothing exported")
    try:
        marker = json.loads(marker_path.read_text())
        checkpoint_dir = output_dir / marker["checkpoint"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadInputError(f"{marker_path} is unreadable ({exc}): re-run the trainer") from None
    if not checkpoint_dir.is_dir():
        raise BadInputError(f"the completed checkpoint {checkpoint_dir} is missing: re-run the "
                            "trainer")
    training = TrainingOutput(output_dir=output_dir, checkpoint_dir=checkpoint_dir, marker=marker)
    if training.is_peft and not (checkpoint_dir / "adapter_config.json").is_file():
        raise BadInputError(f"{checkpoint_dir} has adapter weights but no adapter_config.json: "
                            "the checkpoint is incomplete; re-run the trainer")
    if not training.is_peft and not training.merged_shards():
        raise BadInputError(f"{checkpoint_dir} holds neither an adapter nor model shards: the "
                            "checkpoint is incomplete; re-run the trainer")
    return training
