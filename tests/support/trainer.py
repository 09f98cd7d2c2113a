"""A stand-in PVC for trainer tests, and `tune run` as Kubeflow Trainer composes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kubetune.workspace import Workspace
from tests.support.cli import REPO, clean_env

# What every trainer test keeps short: a few steps of a tiny model.
SHORT = ["batch_size=4", "max_steps_per_epoch=3", "gradient_accumulation_steps=1"]


class Pvc:
    """A stand-in PVC at ``root``: each step's directory where the workspace contract
    (`kubetune.workspace`) puts it."""

    def __init__(self, root: Path) -> None:
        layout = Workspace.from_env({"KUBETUNE_WORKSPACE": str(root)})
        self.root = layout.root
        self.model, self.dataset, self.output = (layout.model_dir, layout.dataset_dir,
                                                 layout.output_dir)
        self.termination_log = root / "termination-log"

    def env(self, **extra: str) -> dict[str, str]:
        return clean_env(KUBETUNE_WORKSPACE=str(self.root),
                         KUBETUNE_TERMINATION_LOG=str(self.termination_log), **extra)

    def runtime_args(self, tokenizer: str = "original/tokenizer.model") -> list[str]:
        """The overrides the ClusterTrainingRuntime's command carries."""
        return [f"output_dir={self.output}", f"tokenizer.path={self.model / tokenizer}",
                f"checkpointer.checkpoint_dir={self.model}"]

    def metrics(self) -> list[dict]:
        path = self.output / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() \
            else []

    def summary(self) -> dict:
        return json.loads((self.output / "summary.json").read_text())

    def complete(self) -> bool:
        return (self.output / "kubetune-complete.json").is_file()


def make_pvc(root: Path, model_dir: Path, dataset_dir: Path | None) -> Pvc:
    """A workspace whose model/ (and dataset/) are the given trees (linked, not copied)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "model").symlink_to(model_dir)
    if dataset_dir is not None:
        (root / "dataset").symlink_to(dataset_dir)
    return Pvc(root)


def tune_run(pvc: Pvc, *args: str, env: dict[str, str] | None = None, timeout: float = 600
             ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kubetune.entrypoints.tune", "run", *args],
                          env=env or pvc.env(), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def start_tune_run(pvc: Pvc, *args: str, env: dict[str, str] | None = None,
                   log: Path | None = None) -> subprocess.Popen:
    out = open(log or os.devnull, "w")
    return subprocess.Popen([sys.executable, "-m", "kubetune.entrypoints.tune", "run", *args],
                            env=env or pvc.env(), cwd=REPO, stdout=out,
                            stderr=subprocess.STDOUT, text=True)


def plain_torchtune_run(pvc: Pvc, recipe: str, config: str, *args: str,
                        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """torchtune's own `tune run` (not our launcher) on the PVC's model, into its output
    dir: ``args`` plus only what upstream needs to load this checkpoint on CPU (the
    architecture's builder and dims, the weight files, the special tokens), as a user
    would write them."""
    from kubetune.tools.plain_torchtune import loading_overrides

    loading = [*loading_overrides(pvc.model, lora="lora" in recipe), "device=cpu",
               "log_peak_memory_stats=False", "optimizer.fused=False",
               "metric_logger._component_=torchtune.training.metric_logging.DiskLogger",
               f"metric_logger.log_dir={pvc.output / 'logs'}"]
    return subprocess.run([sys.executable, "-m", "torchtune._cli.tune", "run", recipe,
                           "--config", config, *args, *loading],
                          env={**(env or pvc.env()), "TQDM_DISABLE": "1"}, cwd=REPO,
                          capture_output=True, text=True, timeout=600)
