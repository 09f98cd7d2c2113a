"""What the trainer leaves in ``output/`` for the next step, and its one reader.

The completion marker is written last (``kubetune.trainer.launcher.finish``): it names the
finished checkpoint, the merged config, the fine-tuning method and the run's fingerprint.
An output directory without it is an unfinished run that nothing downstream trusts.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from kubetune.errors import BadInputError
from kubetune.workspace import (ADAPTER_WEIGHTS_NAME, COMPLETION_MARKER_NAME, SUMMARY_NAME,
                                TRAINER_CONFIG_NAME)

# The fine-tuning methods, as the trainer takes them (--method) and the marker records them.
METHODS = ("lora", "qlora", "dora", "full")


@dataclass(frozen=True)
class CompletionMarker:
    checkpoint: str  # the finished checkpoint's directory, relative to output/
    method: str  # one of METHODS
    config: str = TRAINER_CONFIG_NAME  # the merged config, relative to output/
    steps: int | None = None
    fingerprint: str | None = None  # the run's identity: the same run need not train again
    finished_at: str | None = None

    @property
    def is_peft(self) -> bool:
        """The run saved an adapter (LoRA, DoRA or QLoRA), not only full weights."""
        return self.method != "full"

    def encode(self) -> str:
        return json.dumps(asdict(self), indent=2)


def completed_fingerprint(output_dir: Path) -> str | None:
    """The fingerprint of the run ``output_dir`` holds complete, or None."""
    try:
        return json.loads((Path(output_dir) / COMPLETION_MARKER_NAME).read_text()).get(
            "fingerprint")
    except (OSError, ValueError, AttributeError):
        return None


def read_marker(output_dir: Path) -> CompletionMarker:
    """The completion marker of a finished run; a one-line error for anything else."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        raise BadInputError(f"no training output at {output_dir}: run the trainer first, or "
                            "set --output-dir / KUBETUNE_OUTPUT_DIR")
    marker_path = output_dir / COMPLETION_MARKER_NAME
    if not marker_path.is_file():
        raise BadInputError(f"{output_dir} has no {COMPLETION_MARKER_NAME}: the training run did "
                            "not finish (incomplete epoch); re-run the trainer, nothing exported")
    try:
        found = json.loads(marker_path.read_text())
        checkpoint, config = found["checkpoint"], found.get("config") or ""
        if not isinstance(checkpoint, str) or not isinstance(config, str):
            raise TypeError(f"checkpoint {checkpoint!r}, config {config!r}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadInputError(f"{marker_path} is unreadable ({exc}): re-run the trainer") from None
    if not (output_dir / checkpoint).is_dir():
        raise BadInputError(f"the completed checkpoint {output_dir / checkpoint} is missing: "
                            "re-run the trainer")
    method = found.get("method")
    if method is None:  # written before the marker named it
        method = _method_on_disk(output_dir / checkpoint, parse_config(
            read_config_text(output_dir, config)))
    elif method not in METHODS:
        raise BadInputError(f"{marker_path} names method {method!r}, not one of "
                            f"{', '.join(METHODS)}: re-run the trainer")
    return CompletionMarker(checkpoint=checkpoint, method=method, config=config,
                            steps=found.get("steps"), fingerprint=found.get("fingerprint"),
                            finished_at=found.get("finished_at"))


def _method_on_disk(checkpoint_dir: Path, config: dict) -> str:
    """An older marker's method: an adapter in the checkpoint makes it a PEFT run, whose
    kind the merged config's model section says."""
    if not (checkpoint_dir / ADAPTER_WEIGHTS_NAME).is_file():
        return "full"
    model = config.get("model") or {}
    if model.get("quantize_base"):
        return "qlora"
    if model.get("use_dora"):
        return "dora"
    return "lora"


def read_config_text(output_dir: Path, name: str) -> str | None:
    """The merged config the run trained with, as written; None if there is none."""
    path = Path(output_dir) / name
    return path.read_text() if name and path.is_file() else None


def parse_config(text: str | None) -> dict:
    """The merged config as a dict, interpolations such as ``${output_dir}`` unresolved."""
    if not text:
        return {}
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(OmegaConf.create(text), resolve=False) or {}
    except Exception:  # a malformed config only costs the export some detail
        return {}


def read_summary(output_dir: Path) -> dict:
    """The run's ``summary.json``; empty when it has none."""
    try:
        return json.loads((Path(output_dir) / SUMMARY_NAME).read_text())
    except (OSError, ValueError):
        return {}
