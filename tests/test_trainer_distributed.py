"""Torchtune's distributed recipes on CPU with gloo: 2 processes on one node, and 2 nodes
(two launchers, as two pods) meeting on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import time

import pytest

from kubetune.errors import EXIT_KILLED, EXIT_TRANSIENT
from kubetune.tools.demo.alpaca_like import write_alpaca_like
from kubetune.trainer.performance.cpu_cores import usable_cores
from tests.support.trainer import SHORT, make_pvc, start_tune_run, tune_run

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dataset_args(pvc) -> list[str]:
    return ["dataset=torchtune.datasets.instruct_dataset", "dataset.source=parquet",
            f"dataset.data_dir={pvc.dataset / 'data'}", "epochs=1", *SHORT]


def test_two_processes_lora_distributed_on_cpu(tmp_path, tiny_model_dir):
    # Alpaca-like rows, enough that the token cache tokenizes them with a pool of workers
    # forked from a recipe process (torchrun's worker, with its handlers and threads).
    write_alpaca_like(tmp_path / "alpaca-like", 2400, 2, scale=0.25)
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, tmp_path / "alpaca-like")
    env = pvc.env(PET_NNODES="1", PET_NPROC_PER_NODE="2", PET_NODE_RANK="0")
    # As the controller composes it for 2 processes: a rendezvous endpoint, the
    # distributed LoRA recipe, the multi-device config.
    result = tune_run(pvc, f"--rdzv_endpoint=127.0.0.1:{free_port()}",
                      "lora_finetune_distributed", "--config", "llama3_2/1B_lora",
                      *pvc.runtime_args(), "model.lora_attn_modules=[q_proj,v_proj]",
                      *dataset_args(pvc), env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = pvc.summary()
    assert summary["world_size"] == 2 and summary["steps"] == 3
    assert pvc.complete()
    assert (pvc.output / "epoch_0" / "adapter_model.safetensors").is_file()
    # A pod's log gets progress lines, not carriage-return bars (the recipe forces rank
    # 0's bar on; the bootstrap turns it off without a terminal).
    assert "it/s]" not in result.stderr
    assert "train: step 1/3 (33%) | epoch 1/1 | loss" in result.stdout
    # The data is tokenized once for the node: one process builds the cache, the other
    # waits for it and maps it.
    built = [line for line in result.stderr.splitlines() if "token cache: tokenized" in line]
    assert len(built) == 1, result.stderr[-3000:]
    [entry] = (pvc.root / "cache" / "tokens").glob("*/meta.json")
    meta = json.loads(entry.read_text())
    assert meta["rows_read"] == 2400 and meta["build_workers"] == min(2, usable_cores())


def test_two_nodes_on_loopback_stop_together_resume_and_finish(tmp_path, tiny_model_dir,
                                                              tiny_dataset_dir):
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, tiny_dataset_dir)
    args = [f"--rdzv_endpoint=127.0.0.1:{free_port()}", "full_finetune_distributed",
            "--config", "llama3_3/70B_full_multinode", *pvc.runtime_args(),
            "dataset=torchtune.datasets.instruct_dataset", "dataset.source=parquet",
            f"dataset.data_dir={pvc.dataset / 'data'}", "dataset.packed=False", "epochs=1",
            "batch_size=4", "max_steps_per_epoch=12", "gradient_accumulation_steps=1"]

    def start_nodes(attempt: str) -> list:
        # Two launchers, as the two pods of a 2-node TrainJob, sharing one volume.
        return [start_tune_run(pvc, *args, log=tmp_path / f"{attempt}-node{rank}.log",
                               env=pvc.env(PET_NNODES="2", PET_NPROC_PER_NODE="1",
                                           PET_NODE_RANK=str(rank)))
                for rank in (0, 1)]

    def logs(attempt: str) -> str:
        return "\n".join((tmp_path / f"{attempt}-node{r}.log").read_text() for r in (0, 1))

    nodes = start_nodes("first")
    deadline = time.monotonic() + 300
    while len(pvc.metrics()) < 3 and nodes[0].poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    nodes[0].terminate()  # only node 0's pod is evicted
    codes = [node.wait(timeout=300) for node in nodes]
    assert codes == [EXIT_TRANSIENT, EXIT_TRANSIENT], logs("first")[-3000:]
    stopped_at = pvc.metrics()[-1]["step"]
    # The nodes tokenized the data once between them, on the volume they share.
    assert logs("first").count("token cache: tokenized") == 1, logs("first")[-3000:]

    nodes = start_nodes("second")
    codes = [node.wait(timeout=600) for node in nodes]
    assert codes == [0, 0], logs("second")[-3000:]
    assert logs("second").count(f"done (global step {stopped_at}") == 2  # both nodes resumed
    assert "token cache: tokenized" not in logs("second")  # the restarted pods map it
    assert [m["step"] for m in pvc.metrics()] == list(range(1, 13))
    summary = pvc.summary()
    assert summary["world_size"] == 2 and summary["exit_reason"] == "completed"
    assert pvc.complete()
    assert list((pvc.output / "epoch_0").glob("model-*.safetensors"))

    # Restarted after finishing: both nodes see the marker and stop (neither waits for
    # the other at the rendezvous).
    nodes = start_nodes("third")
    assert [node.wait(timeout=120) for node in nodes] == [0, 0]
    assert logs("third").count("nothing to do") == 2


def test_a_worker_killed_by_a_signal_is_reported_as_such(tmp_path, tiny_model_dir,
                                                         tiny_dataset_dir):
    """Rank 0 SIGKILLed (as the OOM killer does; here by the test hook, at its first
    checkpoint write): torchrun reports it among its workers; kubetune's line names the
    signal and what it usually means, with the restartable code 76."""
    pvc = make_pvc(tmp_path / "pvc", tiny_model_dir, tiny_dataset_dir)
    env = pvc.env(PET_NNODES="1", PET_NPROC_PER_NODE="2", PET_NODE_RANK="0",
                  KUBETUNE_TEST_KILL_AT="1")
    result = tune_run(pvc, f"--rdzv_endpoint=127.0.0.1:{free_port()}",
                      "full_finetune_distributed", "--config", "llama3_2/1B_full",
                      *pvc.runtime_args(), *dataset_args(pvc), env=env)
    assert result.returncode == EXIT_KILLED, result.stderr[-3000:]
    report = pvc.termination_log.read_text().strip()
    assert report.startswith("trainer: recipe full_finetune_distributed was killed by signal 9 "
                             "(SIGKILL), likely the out-of-memory killer"), report
    assert not pvc.complete()
