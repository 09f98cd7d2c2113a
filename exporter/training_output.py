"""Find the checkpoint to export: the one the trainer finished, by its completion marker, or
the saved one with the lowest validation loss (``checkpoint_choice``); check it is whole."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from kubetune.errors import BadInputError
from kubetune.exporter.checkpoint_choice import DEFAULT, ChosenCheckpoint, choose
from kubetune.workspace import (ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, CURVES_NAME,
                                RUN_REPORT_NAME)
from kubetune.workspace.model_files import indexed_shards
from kubetune.workspace.trainer_output import (CompletionMarker, parse_config, read_config_text,
                                               read_marker, read_summary)


@dataclass
class TrainingOutput:
    output_dir: Path
    checkpoint_dir: Path
    marker: CompletionMarker
    # Which checkpoint, chosen how, and its validation loss where the run measured one.
    chosen: ChosenCheckpoint | None = None

    @property
    def checkpoint(self) -> str:
        """The exported checkpoint's directory, relative to output_dir."""
        return self.chosen.name if self.chosen else self.marker.checkpoint

    @property
    def method(self) -> str:
        """full, lora, dora or qlora, as the trainer recorded it."""
        return self.marker.method

    @property
    def is_peft(self) -> bool:
        return self.marker.is_peft

    def merged_shards(self) -> list[Path]:
        """The merged model's shards, as the index names them (empty: none were saved)."""
        names = indexed_shards(self.checkpoint_dir,
                               ": the checkpoint is incomplete; re-run the trainer")
        if names is not None:
            return [self.checkpoint_dir / n for n in names]
        return sorted(self.checkpoint_dir.glob("model*.safetensors"))

    def summary(self) -> dict:
        return read_summary(self.output_dir)

    def carry_report(self, tree: Path) -> dict[str, str]:
        """Copy the trainer's run report (markdown, curves) into the export tree; returns
        the names copied, by kind."""
        carried = {}
        for kind, name in (("report", RUN_REPORT_NAME), ("curves", CURVES_NAME)):
            source = self.output_dir / name
            if source.is_file():
                shutil.copyfile(source, tree / name)
                carried[kind] = name
        return carried

    @cached_property
    def _config_text(self) -> str | None:
        return read_config_text(self.output_dir, self.marker.config)

    def config_text(self) -> str | None:
        return self._config_text

    @cached_property
    def _config(self) -> dict:
        return parse_config(self._config_text)

    def config(self) -> dict:
        """The resolved training config (the trainer's kubetune-config.yaml), parsed once
        per export: the adapter config, the logits check and the model card all read it."""
        return self._config


def locate(output_dir: Path, checkpoint: str = DEFAULT) -> TrainingOutput:
    """``checkpoint``: ``last`` (the run's end) or ``best`` (the lowest validation loss)."""
    output_dir = Path(output_dir)
    marker = read_marker(output_dir)
    chosen = choose(output_dir, marker, checkpoint)
    checkpoint_dir = output_dir / chosen.name
    training = TrainingOutput(output_dir=output_dir, checkpoint_dir=checkpoint_dir, marker=marker,
                              chosen=chosen)
    if training.is_peft and not (checkpoint_dir / ADAPTER_WEIGHTS_NAME).is_file():
        raise BadInputError(f"{checkpoint_dir} lacks {ADAPTER_WEIGHTS_NAME}, which a "
                            f"{marker.method} run saves: the checkpoint is incomplete; re-run "
                            "the trainer")
    if training.is_peft and not (checkpoint_dir / ADAPTER_CONFIG_NAME).is_file():
        raise BadInputError(f"{checkpoint_dir} has adapter weights but no adapter_config.json: "
                            "the checkpoint is incomplete; re-run the trainer")
    if not training.is_peft and not training.merged_shards():
        raise BadInputError(f"{checkpoint_dir} holds neither an adapter nor model shards: the "
                            "checkpoint is incomplete; re-run the trainer")
    return training
