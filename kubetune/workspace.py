"""The workspace contract: where each step reads and writes on the shared volume.

In a cluster the controller mounts the job's PVC at ``/workspace``; the initializers fill
``dataset/`` and ``model/``, the trainer writes ``output/``, the exporter reads all three.
Locally the same code runs against any directory: set ``KUBETUNE_WORKSPACE`` to move the
root, or one of the per-directory variables to move a single step's directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kubetune import env

DEFAULT_ROOT = "/workspace"

# File names every step agrees on.
MANIFEST_NAME = ".kubetune-manifest.json"  # written last by an initializer: the tree is complete
DATASET_DESCRIPTOR_NAME = ".kubetune-dataset.json"  # what the dataset initializer found
REPO_ID_NAME = "original_repo_id.json"  # read by torchtune's HF checkpointer for adapter_config.json
COMPLETION_MARKER_NAME = "kubetune-complete.json"  # written last by the trainer
EXPORT_MANIFEST_NAME = "manifest.json"  # written last by the exporter
STAGING_PREFIX = ".kubetune-staging-"  # sibling directories that are never read by a next step


@dataclass(frozen=True)
class Workspace:
    root: Path
    dataset_dir: Path
    model_dir: Path
    output_dir: Path
    export_dir: Path

    @classmethod
    def from_env(cls, environ: os._Environ | dict | None = None) -> "Workspace":
        environ = os.environ if environ is None else environ
        root = Path(environ.get(env.WORKSPACE) or DEFAULT_ROOT)

        def pick(name: str, default: str) -> Path:
            value = environ.get(name)
            return Path(value) if value else root / default

        return cls(
            root=root,
            dataset_dir=pick(env.DATASET_DIR, "dataset"),
            model_dir=pick(env.MODEL_DIR, "model"),
            output_dir=pick(env.OUTPUT_DIR, "output"),
            export_dir=pick(env.EXPORT_DIR, "export"),
        )


def workspace() -> Workspace:
    """The workspace as the current environment defines it."""
    return Workspace.from_env()
