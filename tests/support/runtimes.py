"""Where the generated runtimes live: ours in runtimes/base, the opt-in `torchtune-*`
drop-ins (upstream's names) in runtimes/overlays/dropin (see runtimes/generate.py)."""

from __future__ import annotations

from pathlib import Path

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
