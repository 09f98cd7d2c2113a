"""The workspace contract: where each step reads and writes on the shared volume.

In a cluster the controller mounts the job's PVC at ``/workspace``; the initializers fill
``dataset/`` and ``model/``, the trainer writes ``output/``, the exporter reads all three.
Locally the same code runs against any directory: set ``KUBETUNE_WORKSPACE`` to move the
root, or one of the per-directory variables to move a single step's directory.

This package is the one place the steps agree on what they leave for each other: the
names below (the token cache's place among them), the trainer's completion marker and its summary and config readers (``trainer_output``), a few
training samples as the trainer tokenized them (``training_samples``), the held-out loss of
each evaluation and saved checkpoint (``validation_record``), the answers to a few
held-out prompts, base and tuned side by side (``answers_record``), the initializers' manifest
(``initializer_manifest``) and the model directory's config and weights (``model_files``;
``weight_headers``: their safetensors headers agree with each other and config.json).
A step reads another step's results through these modules, never through its internals.
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
SUMMARY_NAME = "summary.json"  # the trainer's numbers: steps, loss, speed, the checkpoint
TRAINER_CONFIG_NAME = "kubetune-config.yaml"  # the merged config the recipe ran with
METRICS_NAME = "metrics.jsonl"  # one line per logged step
RUN_REPORT_NAME = "kubetune-report.md"  # the run report page; the exporter carries it
CURVES_NAME = "kubetune-curves.png"  # loss and learning rate by step; carried likewise
TRAINING_SAMPLES_NAME = "kubetune-samples.json"  # a few samples as the trainer tokenized them
# The held-out loss at each evaluation and saved checkpoint, and an early stop (validation_record).
VALIDATION_RECORD_NAME = "kubetune-validation.json"
ANSWERS_NAME = "kubetune-answers.json"  # held-out prompts: reference, base and tuned answers
MODEL_CONFIG_NAME = "config.json"  # a Hugging Face model directory's architecture
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"  # tensor -> shard of a sharded model
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"  # a PEFT adapter (LoRA, DoRA, QLoRA)
ADAPTER_CONFIG_NAME = "adapter_config.json"
TRAINER_LOCK_NAME = ".kubetune-trainer.lock"  # in output_dir: held by the trainer writing it
STAGING_PREFIX = ".kubetune-staging-"  # sibling directories that are never read by a next step
# The trainer's tokenized datasets, one directory per key, under the workspace root (beside
# output/ when there is no workspace): kubetune.trainer.data.token_cache.
TOKEN_CACHE_PATH = "cache/tokens"
# A distillation run's teacher model, fetched by the model initializer as a third
# initializer (kubetune.trainer.objectives.distill).
TEACHER_PATH = "teacher"


@dataclass(frozen=True)
class Workspace:
    root: Path
    dataset_dir: Path
    model_dir: Path
    output_dir: Path
    export_dir: Path

    @property
    def teacher_dir(self) -> Path:
        return self.root / TEACHER_PATH

    @classmethod
    def from_env(cls, environ: os._Environ | dict | None = None) -> "Workspace":
        # The one reader of the workspace's variables (every step's paths come from here).
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
