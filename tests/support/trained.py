"""One real LoRA run of the tiny model per test session (shared by the xdist workers:
`shared_runs.py`), for the exporter's tests.

`kubetune local` runs both initializers, a short torchtune LoRA run and the default
export, each as its own process, exactly as `make demo` does, only with fewer steps.
One epoch: torchtune 0.6.1 on CPU folds each epoch's LoRA into the live base weights
when it saves a checkpoint, so only a one-epoch CPU run has an adapter that matches its
merged model (the exporter's logits check refuses the others).

The dtype is pinned to fp32: left to the machine, a CPU with native bf16 (avx512_bf16,
AMX) trains in bf16, and the numerics tests that compare an export with PEFT or with
the merged model at float32 tolerances would fail there, and only there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import clean_env, kubetune
from tests.support.shared_runs import shared_run
from tests.support.trainer import Pvc

TRAIN_ARGS = [
    "dataset=torchtune.datasets.instruct_dataset", "dataset.split=train", "epochs=1",
    "max_steps_per_epoch=6", "batch_size=8", "gradient_accumulation_steps=1",
    "optimizer.lr=3e-3", "lr_scheduler.num_warmup_steps=2", "model.lora_rank=8",
    "model.lora_alpha=16", "model.apply_lora_to_output=True", "seed=0", "dtype=fp32",
]


class TrainedRun:
    """A finished `kubetune local` run in ``workdir``: its stand-in PVC and the model
    source it started from."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        pvc = Pvc(workdir / "workspace")
        self.workspace, self.output_dir, self.model_dir, self.dataset_dir = (
            pvc.root, pvc.output, pvc.model, pvc.dataset)
        self.base_source = workdir / "sources" / "tiny-llama3"

    def env(self, **extra: str) -> dict[str, str]:
        """A pod's environment for the exporter over this run's workspace."""
        return clean_env(KUBETUNE_WORKSPACE=str(self.workspace), **extra)


def train(workdir: Path, method: str = "lora") -> TrainedRun:
    result = kubetune("local", "--workdir", str(workdir), "--method", method, *TRAIN_ARGS,
                      timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return TrainedRun(workdir)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> TrainedRun:
    # Read by a dozen files that xdist spreads over both workers: trained once for both.
    return TrainedRun(shared_run(tmp_path_factory, "trained-lora", train))
