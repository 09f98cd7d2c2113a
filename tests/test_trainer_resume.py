"""Preemption: SIGTERM mid-run saves a resumable checkpoint and exits 75; the restarted
pod (same command) resumes from that step and finishes, without repeating steps."""

from __future__ import annotations

import time

import pytest

from kubetune.errors import EXIT_TRANSIENT
from tests.support.trainer import make_pvc, start_tune_run, tune_run

pytestmark = pytest.mark.slow


def test_sigterm_then_restart_resumes_and_finishes(tmp_path, tiny_model_dir, tiny_dataset_dir):
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, tiny_dataset_dir)
    args = ["lora_finetune_single_device", "--config", "llama3_2/1B_lora_single_device",
            *pvc.runtime_args(), "dataset=torchtune.datasets.instruct_dataset",
            "dataset.source=parquet", f"dataset.data_dir={pvc.dataset / 'data'}",
            "epochs=2", "max_steps_per_epoch=15", "batch_size=4",
            "gradient_accumulation_steps=1", "seed=1"]
    first = start_tune_run(pvc, *args, log=tmp_path / "first.log")
    deadline = time.monotonic() + 300
    while len(pvc.metrics()) < 3 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    first.terminate()  # SIGTERM, as the kubelet sends on eviction
    assert first.wait(timeout=120) == EXIT_TRANSIENT, (tmp_path / "first.log").read_text()[-3000:]
    report = pvc.termination_log.read_text()
    assert "resumable checkpoint" in report and len(report.strip().splitlines()) == 1
    assert not pvc.complete()
    stopped_at = pvc.metrics()[-1]["step"]
    assert stopped_at < 30

    second = tune_run(pvc, *args)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"step(s) done (global step {stopped_at}" in second.stderr
    steps = [m["step"] for m in pvc.metrics()]
    assert steps == list(range(1, 31))  # each step once: resumed, not restarted
    assert pvc.summary()["exit_reason"] == "completed" and pvc.complete()
