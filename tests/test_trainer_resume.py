"""Preemption: SIGTERM mid-run saves a resumable checkpoint and exits 75; the restarted
pod (same command) resumes from that step and finishes, without repeating steps."""

from __future__ import annotations

import time

import pytest

from kubetune.errors import EXIT_TRANSIENT
from tests.support.trainer import make_pvc, start_tune_run, tune_run

pytestmark = pytest.mark.slow


def stop_and_resume(tmp_path, pvc, args, env, total_steps) -> None:
    first = start_tune_run(pvc, *args, env=env, log=tmp_path / "first.log")
    deadline = time.monotonic() + 300
    while len(pvc.metrics()) < 3 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    first.terminate()  # SIGTERM, as the kubelet sends on eviction
    assert first.wait(timeout=120) == EXIT_TRANSIENT, (tmp_path / "first.log").read_text()[-3000:]
    report = pvc.termination_log.read_text()
    assert "resumable checkpoint" in report and len(report.strip().splitlines()) == 1
    assert not pvc.complete()
    stopped_at = pvc.metrics()[-1]["step"]
    assert stopped_at < total_steps

    second = tune_run(pvc, *args, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"step(s) done (global step {stopped_at}" in second.stderr
    steps = [m["step"] for m in pvc.metrics()]
    assert steps == list(range(1, total_steps + 1))  # each step once: resumed, not restarted
    assert pvc.summary()["exit_reason"] == "completed" and pvc.complete()


def data_args(pvc) -> list[str]:
    return ["dataset=torchtune.datasets.instruct_dataset", "dataset.source=parquet",
            f"dataset.data_dir={pvc.dataset / 'data'}", "batch_size=4",
            "gradient_accumulation_steps=1", "seed=1"]


def test_sigterm_then_restart_resumes_lora_across_epochs(tmp_path, tiny_model_dir,
                                                        tiny_dataset_dir):
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, tiny_dataset_dir)
    args = ["lora_finetune_single_device", "--config", "llama3_2/1B_lora_single_device",
            *pvc.runtime_args(), *data_args(pvc), "epochs=2", "max_steps_per_epoch=15"]
    stop_and_resume(tmp_path, pvc, args, pvc.env(), total_steps=30)


def test_sigterm_stops_both_ranks_of_a_distributed_full_finetune(tmp_path, tiny_model_dir,
                                                                 tiny_dataset_dir):
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, tiny_dataset_dir)
    env = pvc.env(PET_NNODES="1", PET_NPROC_PER_NODE="2", PET_NODE_RANK="0")
    args = ["full_finetune_distributed", "--config", "llama3_2/1B_full", *pvc.runtime_args(),
            *data_args(pvc), "epochs=1", "max_steps_per_epoch=20"]
    stop_and_resume(tmp_path, pvc, args, env, total_steps=20)
