"""Where the generated runtimes live: ours in runtimes/base, the opt-in `torchtune-*`
drop-ins (upstream's names) in runtimes/overlays/dropin (see runtimes/generate.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "runtimes" / "base"
DROPIN = REPO / "runtimes" / "overlays" / "dropin"


def runtime_files() -> list[Path]:
    """Every generated runtime file, base and drop-in."""
    return sorted((p for d in (BASE, DROPIN) for p in d.glob("*.yaml")
                   if p.name != "kustomization.yaml"), key=lambda p: p.name)


def runtime_file(name: str) -> Path:
    """A runtime's file by its name, with or without `.yaml`."""
    file_name = name if name.endswith(".yaml") else f"{name}.yaml"
    return (DROPIN if file_name.startswith("torchtune-") else BASE) / file_name


def write_trainjob(path: Path, runtime: str, spec: dict | None = None, name: str = "tiny"
                   ) -> Path:
    """A TrainJob YAML at ``path`` referencing ``runtime``, with ``spec`` beside runtimeRef."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": name}, "spec": {"runtimeRef": {"name": runtime}, **(spec or {})}}))
    return path


def initializer_uris(model: str, dataset: str) -> dict:
    """A TrainJob spec's initializer block naming both STORAGE_URIs."""
    return {"initializer": {"model": {"storageUri": model}, "dataset": {"storageUri": dataset}}}
